"""The decoding cache: what lets the decoder produce one position per step (§3.2.3, §6.1)
without recomputing the positions before it.

For each decoder layer the cache is one dict of four tensors:

    "key", "value"                [B, kv_heads, L, d_k]  self-attention keys and values of
                                  positions 0 .. L - 1: preallocated zeros, written as each
                                  position is decoded (`write`), so every shape stays static
                                  (XLA, TPUs, SavedModels); the causal mask hides the slots
                                  not written yet.
    "memory_key", "memory_value"  [B, kv_heads, S, d_k]  encoder-decoder keys and values of
                                  the encoder memory, computed once per source batch.

Where the decoding length is not static (on TensorFlow outside XLA: the translators' traces
and the SavedModel's signatures) a search starts the self-attention buffers at `FIRST_LENGTH`
positions and doubles them as decoding reaches their end (`with_room`): a sentence rarely
needs the whole source length + 50 that the limit allows, and every step's attention and
beam reordering reads the whole buffer.

Heads come before positions, so attention reads the cache without a transpose. A search loop
carries only the self-attention half (`carried`), which changes every step, and keeps the
memory half (`fixed`) outside the loop; beam search `reorder`s the carried half to follow each
hypothesis's parent.
"""

import keras
from keras import ops

SELF_ATTENTION = ("key", "value")
MEMORY = ("memory_key", "memory_value")
FIRST_LENGTH = 16  # positions of a growing self-attention buffer before its first doubling


def empty(batch_size, kv_heads, max_length, head_dim, dtype):
    """Zeroed self-attention keys and values, each [B, kv_heads, max_length, d_k]."""
    zeros = ops.zeros((batch_size, kv_heads, max_length, head_dim), dtype)
    return zeros, zeros


def layer_cache(key, value, memory_key, memory_value):
    """One decoder layer's cache, as laid out above."""
    return {"key": key, "value": value, "memory_key": memory_key, "memory_value": memory_value}


def write(buffer, update, index):
    """`buffer` [B, H, L, d] with `update` [B, H, T, d] written at positions index .. index +
    T - 1, static shapes throughout (XLA, TPUs, SavedModels)."""
    update = ops.cast(update, buffer.dtype)
    if keras.backend.backend() == "tensorflow":
        # TensorFlow's `slice_update` is XLA's DynamicUpdateSlice, which stock TF Serving
        # cannot run outside XLA; a scatter of the T positions is core TF.
        return scatter_write(buffer, update, index)
    return ops.slice_update(buffer, (0, 0, index, 0), update)


def scatter_write(buffer, update, index):
    """`write` as a scatter of core TensorFlow ops (TensorFlow only). The buffer's values must
    be finite (a cache's are)."""
    import tensorflow as tf

    from keras_transformer.compiled import in_xla_function

    shape = tf.shape(update)
    batch, heads, steps = tf.meshgrid(tf.range(shape[0]), tf.range(shape[1]),
                                      tf.range(shape[2]) + tf.cast(index, tf.int32),
                                      indexing="ij")
    indices = tf.reshape(tf.stack([batch, heads, steps], axis=-1), [-1, 3])
    updates = tf.reshape(update, [-1, shape[3]])
    if in_xla_function():  # XLA writes in place itself, and has no kernel for the adds below
        return tf.tensor_scatter_nd_update(buffer, indices, updates)
    # `tensor_scatter_nd_update` copies the whole buffer, at every decoding step: its kernel
    # never reuses its input's memory. These two adds reuse it whenever nothing else holds
    # it: the first zeroes the T positions (x + -x is exactly 0 for a finite x), the second
    # adds the update there, so the result is the update bit for bit.
    zeroed = tf.raw_ops.ScatterNdNonAliasingAdd(input=buffer, indices=indices,
                                                updates=-tf.gather_nd(buffer, indices))
    return tf.raw_ops.ScatterNdNonAliasingAdd(input=zeroed, indices=indices, updates=updates)


def can_grow(max_length):
    """Whether a search may start its buffers at `FIRST_LENGTH` and grow them up to
    `max_length`: on TensorFlow, outside XLA, where `max_length` is a tensor (a static length
    keeps every shape static, as XLA and TPUs need)."""
    if keras.backend.backend() != "tensorflow" or isinstance(max_length, int):
        return False
    from keras_transformer.compiled import in_xla_function

    return not in_xla_function()


def with_room(carried_caches, index, max_length):
    """The carried caches with room for position `index`: as they are, or, once `index` has
    reached their length, zero-padded to twice that length (at most `max_length`). Only
    where `can_grow`."""
    import tensorflow as tf

    length = tf.shape(carried_caches[0]["key"])[2]

    def doubled():
        more = tf.minimum(2 * length, max_length) - length
        padding = [[0, 0], [0, 0], [0, more], [0, 0]]
        return tf.nest.map_structure(lambda t: tf.pad(t, padding), carried_caches)

    return tf.cond(index < length, lambda: carried_caches, doubled)


def carried(caches):
    """The part of per-layer caches that changes every step: the self-attention keys, values."""
    return [{name: c[name] for name in SELF_ATTENTION} for c in caches]


def fixed(caches):
    """The part that never changes while decoding: the encoder-decoder keys and values."""
    return [{name: c[name] for name in MEMORY} for c in caches]


def merged(carried_caches, fixed_caches):
    """Whole per-layer caches from their `carried` and `fixed` parts."""
    return [{**c, **f} for c, f in zip(carried_caches, fixed_caches)]


def reorder(carried_caches, parents):
    """The carried caches (or any structure of [N, ...] tensors) of the hypotheses `parents`
    [N] (beam search: each hypothesis continues its parent's). The fixed part is the same for
    every beam of a source."""
    return keras.tree.map_structure(lambda t: ops.take(t, parents, axis=0), carried_caches)
