"""What the encoder and decoder stacks share (§3.1): N identical layers over the embeddings
plus positional encodings, with dropout, and a final LayerNorm in the pre-LN variant."""

import keras

from keras_transformer.embedding import make_position_layer
from keras_transformer.dropout import Dropout
from keras_transformer.layer_norm import LayerNorm


def layer_norm(epsilon, name, dtype):
    return LayerNorm(epsilon=epsilon, name=name, dtype=dtype)


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
        self.dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.layers = [self.layer_class(**self.layer_args, name=f"layer_{i}",
                                        dtype=self.dtype_policy) for i in range(num_layers)]
        self.final_norm = (layer_norm(layer_norm_epsilon, "final_norm", self.dtype_policy)
                           if norm_first else None)

    def compute_output_shape(self, input_shape, *args):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **self.layer_args, "num_layers": self.num_layers,
                "position": self.position, "max_length": self.max_length}
