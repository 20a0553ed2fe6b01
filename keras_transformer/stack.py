"""What the encoder and decoder share (§3.1): layers of attention and feed-forward sub-layers,
each followed by dropout, a residual connection and layer normalization, stacked N times over
the embeddings plus positional encodings."""

import keras

from keras_transformer.attention import MultiHeadAttention
from keras_transformer.dropout import Dropout
from keras_transformer.embedding import make_position_layer
from keras_transformer.feed_forward import FeedForward
from keras_transformer.layer_norm import (LayerNorm, compiled_add_and_norm,
                                          compiles_add_and_norm)


def make_layer_norm(epsilon, name, dtype):
    """A `LayerNorm` over the last axis, which computes in float32 under mixed precision and
    returns the compute dtype (the gain `gamma` and bias `beta` [d])."""
    return LayerNorm(epsilon=epsilon, name=name, dtype=dtype)


class StackedLayer(keras.layers.Layer):
    """The settings and sub-layers an `EncoderLayer` and a `DecoderLayer` share: rates are
    floats (`dropout` on sub-layer outputs, `attention_dropout` on attention weights), the
    sub-layers come from `make_attention(name)`, `make_feed_forward()`, `make_norm(name)` and
    `make_dropout(name)`; each subclass creates `feed_forward`, `feed_forward_dropout` and
    `feed_forward_norm`, which `feed_forward_sublayer` runs."""

    def __init__(self, num_heads, d_ff, key_dim=None, num_kv_heads=None, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.d_ff, self.key_dim = num_heads, d_ff, key_dim
        self.num_kv_heads, self.dropout = num_kv_heads, dropout
        self.attention_dropout, self.norm_first = attention_dropout, norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def make_attention(self, name):
        """A `MultiHeadAttention` of the layer's settings."""
        return MultiHeadAttention(self.num_heads, self.key_dim, self.num_kv_heads,
                                  self.attention_dropout, name=name, dtype=self.dtype_policy)

    def make_feed_forward(self):
        """The layer's `FeedForward` (§3.3)."""
        return FeedForward(self.d_ff, name="feed_forward", dtype=self.dtype_policy)

    def make_norm(self, name):
        """The layer normalization (Ba et al., 2016) of one sub-layer's residual connection
        (§3.1), with the layer's epsilon; statistics in float32 under mixed precision."""
        return make_layer_norm(self.layer_norm_epsilon, name, self.dtype_policy)

    def make_dropout(self, name):
        """The residual dropout of one sub-layer's output (§5.4, P_drop = `dropout`)."""
        return Dropout(self.dropout, name=name, dtype=self.dtype_policy)

    def norm_before(self, x, norm):
        """A sub-layer's input: x, or LayerNorm(x) with `norm_first` (pre-LN)."""
        return norm(x) if self.norm_first else x

    def add_and_norm(self, x, sublayer_output, dropout, norm, training=None):
        """"Add & Norm" (Figure 1): the sub-layer's output dropped out (§5.4) and added to its
        input x, then normalized (§3.1): LayerNorm(x + Dropout(Sublayer(x))); with
        `norm_first` the norm came before the sub-layer instead (`norm_before`). In training
        under bfloat16 on CPUs that compute it natively, the same as one XLA pass each way
        (`compiled_add_and_norm`)."""
        if not self.norm_first and compiles_add_and_norm(x, dropout, norm, training):
            return compiled_add_and_norm(x, sublayer_output, dropout, norm)
        x = x + dropout(sublayer_output, training=training)
        return x if self.norm_first else norm(x)

    def feed_forward_sublayer(self, x, training=None):
        """The position-wise feed-forward network (§3.3), with its Add & Norm."""
        y = self.feed_forward(self.norm_before(x, self.feed_forward_norm))
        return self.add_and_norm(x, y, self.feed_forward_dropout, self.feed_forward_norm,
                                 training)

    def compute_output_shape(self, input_shape, *args):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "d_ff": self.d_ff,
                "key_dim": self.key_dim, "num_kv_heads": self.num_kv_heads,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first, "layer_norm_epsilon": self.layer_norm_epsilon}


class LayerStack(keras.layers.Layer):
    """`num_layers` instances of `layer_class` (set by the subclass), the position layer, the
    embedding dropout and, when `norm_first`, the final norm. Subclasses define `call`."""

    layer_class = None

    def __init__(self, num_layers, num_heads, d_ff, key_dim=None, num_kv_heads=None,
                 dropout=0.1, attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6,
                 position="sinusoidal", max_length=1024, **kwargs):
        super().__init__(**kwargs)
        self.layer_args = dict(num_heads=num_heads, d_ff=d_ff, key_dim=key_dim,
                               num_kv_heads=num_kv_heads, dropout=dropout,
                               attention_dropout=attention_dropout, norm_first=norm_first,
                               layer_norm_epsilon=layer_norm_epsilon)
        self.num_layers, self.position, self.max_length = num_layers, position, max_length
        self.positions = make_position_layer(position, max_length, self.dtype_policy)
        self.drop_embeddings = Dropout(dropout, dtype=self.dtype_policy)
        self.layers = [self.layer_class(**self.layer_args, name=f"layer_{i}",
                                        dtype=self.dtype_policy) for i in range(num_layers)]
        self.final_norm = (make_layer_norm(layer_norm_epsilon, "final_norm", self.dtype_policy)
                           if norm_first else None)

    def build(self, input_shape, memory_shape=None):
        self.positions.build(input_shape)
        for layer in self.layers:  # decoder layers also see the memory's shape
            layer.build(input_shape, *([] if memory_shape is None else [memory_shape]))
        if self.final_norm is not None:
            self.final_norm.build(input_shape)

    def compute_output_shape(self, input_shape, *args):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **self.layer_args, "num_layers": self.num_layers,
                "position": self.position, "max_length": self.max_length}
