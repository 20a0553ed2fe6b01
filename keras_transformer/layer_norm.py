"""Layer normalization, applied around every sub-layer (§3.1: LayerNorm(x + Sublayer(x)))."""

import keras
from keras import ops


def layer_norm(x, gamma, beta, epsilon):
    """gamma * (x - mean) / sqrt(var + epsilon) + beta over the last axis of x [..., d],
    computed in float32 and returned in x's dtype. (A closed-form gradient written by hand
    was removed: `python -m benchmarks.kernels` showed no end-to-end gain.)"""
    x32 = ops.cast(x, "float32")
    mean, variance = ops.moments(x32, axes=[-1], keepdims=True)
    normed = (x32 - mean) * ops.rsqrt(variance + epsilon)
    return ops.cast(normed * ops.cast(gamma, "float32") + ops.cast(beta, "float32"), x.dtype)


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
        return layer_norm(ops.cast(x, self.compute_dtype), self.gamma, self.beta, self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
