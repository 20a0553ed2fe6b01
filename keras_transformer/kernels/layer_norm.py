"""Layer normalization with its gradient written out (speed work; see kernels/__init__.py)."""

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
