"""The encoder's real tokens packed into rows of their own, so that its position-wise work (the
projections, the feed-forward network, dropout and the Add & Norms, §3.1-3.3) skips the
padding of a batch's shorter sentences; attention alone needs the [B, S] layout, and gets it
by one gather per projection. TensorFlow only, outside XLA (the number of real tokens changes
from batch to batch)."""

import tensorflow as tf

from keras_transformer.compiled import in_xla_function, on_cpus_only, padding_to_multiple

# The packed rows are padded with zero rows to a multiple of this. A batch's count of real
# source tokens is new at nearly every batch, and oneDNN builds each product anew for a row
# count it has not seen (about 0.5 ms a product); padded, the counts repeat
# (benchmarks/results/encoder_packing.md).
ROWS_MULTIPLE = 64


def pays_here():
    """Whether the encoder packs its real tokens in this trace: where TensorFlow runs the ops
    (XLA, in a train step compiled with `jit_compile` or on TPUs, needs static row counts),
    on CPUs, where it was measured (benchmarks/results/encoder_packing.md)."""
    return on_cpus_only() and not in_xla_function()


class RealTokens:
    """Where the real tokens of a [B, S] batch are, and the gathers between the two layouts.

    Rows are the real tokens in row-major order, then zero rows up to a multiple of
    `ROWS_MULTIPLE`: [N, width], N = number of True entries of `padding_mask` rounded up.
    Unpacked, padded positions hold zeros. Each gather's gradient is the other one (nothing
    reads the zero rows back, so they get none).
    """

    def __init__(self, padding_mask):
        shape = tf.shape(padding_mask)
        self.batch_size, self.length = shape[0], shape[1]
        flat = tf.reshape(padding_mask, [-1])
        self.positions = tf.cast(tf.where(flat)[:, 0], tf.int32)  # of the real tokens: b * S + s
        self.zero_rows = padding_to_multiple(tf.shape(self.positions)[0], ROWS_MULTIPLE)
        self.rows = tf.shape(self.positions)[0] + self.zero_rows  # N
        # The row each position reads when unpacking: its rank, or N (a zero row) if padded.
        ranks = tf.cumsum(tf.cast(flat, tf.int32)) - 1
        ranks = tf.where(flat, ranks, self.rows)
        self.ranks = tf.reshape(ranks, [self.batch_size, 1, self.length])

    def pack(self, x):
        """x [B, S, width] -> [N, width]."""
        return self.pack_heads(tf.expand_dims(x, 1))

    def unpack(self, rows):
        """rows [N, width] -> [B, S, width]."""
        shape = [self.batch_size, self.length, rows.shape[-1]]
        return tf.reshape(self.unpack_heads(rows, 1), shape)

    def pack_heads(self, x):
        """x [B, heads, S, d] -> [N, heads * d] (attention's heads merged, §3.2.2)."""

        @tf.custom_gradient
        def pack(x):
            heads = x.shape[1]
            return self._pack_heads(x), lambda upstream: self._unpack_heads(upstream, heads)

        return pack(x)

    def unpack_heads(self, rows, heads):
        """rows [N, heads * d] -> [B, heads, S, d] (split into heads for attention)."""

        @tf.custom_gradient
        def unpack(rows):
            return self._unpack_heads(rows, heads), self._pack_heads

        return unpack(rows)

    def _pack_heads(self, x):
        heads, d = x.shape[1], x.shape[-1]
        batch, position = self.positions // self.length, self.positions % self.length
        index = (batch[:, None] * heads + tf.range(heads)[None]) * self.length + position[:, None]
        real = tf.reshape(tf.gather(tf.reshape(x, [-1, d]), index), [-1, heads * d])
        return tf.pad(real, [[0, self.zero_rows], [0, 0]])

    def _unpack_heads(self, rows, heads):
        d = rows.shape[-1] // heads
        rows = tf.concat([rows, tf.zeros([1, rows.shape[-1]], rows.dtype)], 0)
        index = self.ranks * heads + tf.range(heads)[None, :, None]  # [B, heads, S]
        return tf.gather(tf.reshape(rows, [-1, d]), index)
