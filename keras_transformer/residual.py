"""The residual connection around every sub-layer (§3.1, §5.4)."""

import keras

from keras_transformer.dropout import Dropout
from keras_transformer.layer_norm import LayerNorm


@keras.saving.register_keras_serializable(package="keras_transformer")
class Residual(keras.layers.Layer):
    """A sub-layer's residual connection, with its layer normalization and its dropout:

        post-LN (the paper, §3.1 and §5.4):  y = LayerNorm(x + Dropout(Sublayer(x)))
        pre-LN (`norm_first`, a later variant): y = x + Dropout(Sublayer(LayerNorm(x)))

    Call: x [B, T, d_model] and `sublayer=`, a callable of one tensor [B, T, d_model]
    (attention or the feed-forward network; a keyword, as Keras takes only tensors by
    position). The sub-layer may return a `WithCache`/`WithWeights` named tuple
    (keras_transformer/outputs.py): the same kind comes back, its output replaced by y.
    Returns y [B, T, d_model].
    """

    def __init__(self, dropout=0.1, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout, self.norm_first = dropout, norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm = LayerNorm(layer_norm_epsilon, name="norm", dtype=self.dtype_policy)
        self.drop_output = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.norm.build(input_shape)

    def call(self, x, sublayer, training=None):
        result = sublayer(self.norm(x) if self.norm_first else x)
        out = result.outputs if isinstance(result, tuple) else result
        y = x + self.drop_output(out, training=training)
        if not self.norm_first:
            y = self.norm(y)
        return result._replace(outputs=y) if isinstance(result, tuple) else y

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon}
