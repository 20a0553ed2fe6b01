"""Embeddings and positional encodings (§3.4, §3.5)."""

import math

import keras
from keras import ops


def sinusoid_table(positions, d_model, max_wavelength=10000.0):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5).

    `positions` is a 1-D tensor; the table [len(positions), d_model] is computed in float32
    (bfloat16 cannot tell position 256 from 257).
    """
    positions = ops.cast(positions, "float32")[:, None]
    even = ops.arange(0, d_model, 2, dtype="float32")
    angles = positions / ops.power(max_wavelength, even / d_model)
    interleaved = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # sin on 2i, cos on 2i+1
    return ops.reshape(interleaved, (-1, 2 * ((d_model + 1) // 2)))[:, :d_model]


class PositionLayer(keras.layers.Layer):
    """What both position layers do with their call: `inputs` [B, T, d_model] (only the shape
    is used) and `start_index`, the position of the first step (decoding one token at a time
    passes the current step), or `positions` [B, T] int, each token's own position (rows that
    hold several sentences restart at 0). Returns the encodings [1, T, d_model] ([B, T,
    d_model] with `positions`) in the layer's compute dtype, to add to the inputs. Subclasses
    give `encode(positions [N, T], d_model)` -> [N, T, d_model]."""

    def call(self, inputs, start_index=0, positions=None):
        if positions is None:
            positions = (ops.arange(ops.shape(inputs)[1]) + ops.cast(start_index, "int32"))[None]
        return ops.cast(self.encode(positions, inputs.shape[-1]), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (1,) + tuple(input_shape[1:])


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(PositionLayer):
    """The fixed sinusoidal positional encoding of §3.5, interleaved; called as
    `PositionLayer`: inputs [B, T, d_model] -> [1, T, d_model] ([B, T, d_model] with
    `positions`)."""

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength

    def encode(self, positions, d_model):
        """positions [N, T] int -> the sinusoids [N, T, d_model] (float32)."""
        table = sinusoid_table(ops.reshape(positions, (-1,)), d_model, self.max_wavelength)
        return ops.reshape(table, (*ops.shape(positions), d_model))

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(PositionLayer):
    """Learned position embeddings, Table 3 row E (the paper's alternative to §3.5): a table
    [max_length, d_model]; called as `PositionLayer`: inputs [B, T, d_model] -> [1, T, d_model]
    ([B, T, d_model] with `positions`)."""

    def __init__(self, max_length, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(self.max_length, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=input_shape[-1] ** -0.5),
        )

    def encode(self, positions, d_model):
        """positions [N, T] int -> their rows of the table [N, T, d_model]."""
        return ops.take(self.position_embeddings, positions, axis=0)

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """One weight matrix [vocab_size, d_model] for the source embedding, the target embedding
    and the pre-softmax linear map (§3.4). Embeddings are multiplied by sqrt(d_model).

    Call: ids [B, T] int -> [B, T, d_model]; with `reverse=True` (keras-hub's
    `ReversibleEmbedding` convention), `logits`.
    `logits(x, float32_product=False)`: x [B, T, d_model] -> [B, T, vocab_size] float32,
    x W^T (no bias). The product runs in the compute dtype (under mixed_bfloat16 a bfloat16
    matmul that accumulates in float32, as keras-hub's `ReversibleEmbedding` and tensor2tensor
    on TPU do) and is cast to float32 for the softmax and the loss; `float32_product=True`
    multiplies in float32 instead (x cast up, the table as stored), for the decoding steps:
    full-precision beam scores, and no pass over the [V, d] table to cast it at each step.
    """

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
            autocast=False,  # read in float32; `call` casts it to the compute dtype itself
        )

    def call(self, ids, reverse=False):
        if reverse:
            return self.logits(ids)
        # Gather, then cast the rows: casting the whole [V, d] table would cost a pass over it
        # at every call (every decoding step among them).
        rows = ops.take(self.embeddings, ops.cast(ids, "int32"), axis=0)
        return ops.cast(rows, self.compute_dtype) * ops.cast(math.sqrt(self.d_model),
                                                             self.compute_dtype)

    def logits(self, x, float32_product=False):
        """x [B, T, d_model] -> logits [B, T, vocab_size] in float32 (x W^T, no bias)."""
        dtype = "float32" if float32_product else self.compute_dtype
        # A 2-D matmul: a batched one would broadcast the table and sum its gradient over B.
        flat = ops.cast(ops.reshape(x, (-1, self.d_model)), dtype)
        table = ops.cast(self.embeddings, dtype)
        if keras.backend.backend() == "tensorflow" and not float32_product:
            logits = product_with_table(flat, table)
        else:
            # An einsum, so that no backend is asked for an explicit transpose of the table.
            logits = ops.einsum("nd,vd->nv", flat, table)
        return ops.cast(ops.reshape(logits, (*ops.shape(x)[:-1], self.vocab_size)), "float32")

    def compute_output_shape(self, input_shape, reverse=False):
        if reverse:
            return tuple(input_shape)[:-1] + (self.vocab_size,)
        return tuple(input_shape) + (self.d_model,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse)
        return keras.KerasTensor(shape, "float32" if reverse else self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model}


def product_with_table(flat, table):
    """flat [N, d] times table [V, d] transposed -> [N, V] (TensorFlow only), with the two
    products of its gradient, d flat = upstream table and d table = upstream^T flat, run one
    after the other. TensorFlow would run them at once, being independent: on a CPU the two
    largest products of the step then share the cores and take longer together than one
    after the other (benchmarks/results/output_projection.md)."""
    import tensorflow as tf

    @tf.custom_gradient
    def product(flat, table):
        def gradient(upstream):
            d_flat = tf.matmul(upstream, table)
            with tf.control_dependencies([d_flat]):
                d_table = tf.matmul(upstream, flat, transpose_a=True)
            return d_flat, d_table

        return tf.matmul(flat, table, transpose_b=True), gradient

    # A tensor, not the variable: TensorFlow's custom gradient would otherwise ask for the
    # variable's gradient apart from the inputs' (a float32 table's cast returns it as it is).
    return product(flat, tf.identity(table))


def make_position_layer(kind, max_length, dtype=None):
    """The position layer a config names: "sinusoidal" (§3.5) or "learned" (Table 3 row E)."""
    if kind == "learned":
        return LearnedPositionEmbedding(max_length, name="positions", dtype=dtype)
    return PositionalEncoding(name="positions", dtype=dtype)
