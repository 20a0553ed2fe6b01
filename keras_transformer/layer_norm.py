"""Layer normalization, applied around every sub-layer (§3.1: LayerNorm(x + Sublayer(x)))."""

import keras
import tensorflow as tf


def layer_norm(x, gamma, beta, epsilon):
    """gamma * (x - mean) / sqrt(var + epsilon) + beta over the last axis of x [..., d],
    computed in float32 and returned in x's dtype. The gradient is written out (the standard
    closed form), about half the ops of differentiating the composition."""

    @tf.custom_gradient
    def normalize(x, gamma, beta):
        x32 = tf.cast(x, tf.float32)
        centered = x32 - tf.reduce_mean(x32, axis=-1, keepdims=True)
        inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), -1, keepdims=True) + epsilon)
        normed = centered * inv

        def grad(dy):
            dy = tf.cast(dy, tf.float32)
            batch_axes = tf.range(tf.rank(dy) - 1)
            g = dy * gamma
            dx = inv * (g - tf.reduce_mean(g, -1, keepdims=True)
                        - normed * tf.reduce_mean(g * normed, -1, keepdims=True))
            return (tf.cast(dx, x.dtype), tf.reduce_sum(dy * normed, batch_axes),
                    tf.reduce_sum(dy, batch_axes))

        return tf.cast(normed * gamma + beta, x.dtype), grad

    return normalize(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


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
