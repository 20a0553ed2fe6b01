"""Layer normalization, applied around every sub-layer (§3.1: LayerNorm(x + Sublayer(x)))."""

import keras
import tensorflow as tf

from keras_transformer.kernels.layer_norm import layer_norm


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNorm(keras.layers.Layer):
    """Layer normalization (Ba et al., 2016) over the last axis, with a learned gain `gamma`
    and bias `beta` [d] (the weights of `keras.layers.LayerNormalization`, under the same
    names). Statistics are computed in float32 under mixed precision.

    Call: x [..., d] -> [..., d] in the layer's compute dtype.
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(autocast=False, **kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        d = input_shape[-1]
        self.gamma = self.add_weight(name="gamma", shape=(d,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(d,), initializer="zeros")

    def call(self, x):
        return layer_norm(tf.cast(x, self.compute_dtype), self.gamma, self.beta, self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
