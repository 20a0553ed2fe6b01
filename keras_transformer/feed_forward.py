"""The position-wise feed-forward network (§3.3)."""

import keras

from keras_transformer.dense import Dense


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, equation 2): the same weights at every position.

    Call: x [B, T, d_model] -> [B, T, d_model]; the inner width is d_ff.
    """

    def __init__(self, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.inner = Dense(self.d_ff, activation="relu", name="inner", dtype=self.dtype_policy)
        self.inner.build((None, d_model))
        self.outer = Dense(d_model, name="outer", dtype=self.dtype_policy)
        self.outer.build((None, self.d_ff))

    def call(self, x):
        return self.outer(self.inner(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "d_ff": self.d_ff}

