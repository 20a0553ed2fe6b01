"""Dropout (§5.4: residual dropout on every sub-layer output and on the embedding sums)."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (the same seed generator, so weight files carry its state)
    that draws 16 random bits per element instead of a uniform float, so that the rate holds
    under mixed_bfloat16: Keras then draws a bfloat16 uniform, which drops 10.2% for a rate of
    0.1 (tests/test_layers.py checks this rate under mixed_bfloat16). The rate is rounded to a
    multiple of 2^-16. Falls back to Keras for `noise_shape` or an odd last dimension.

    It is kept for that rate, not for speed: end to end it buys nothing measurable
    (`python -m benchmarks.kernels`, 2-core CPU, float32: stock Dropout at 1.00x and 1.13x
    the tokens/s of this one, medians of two rounds, runs spread about 10%).

    Call: x [..., d], training -> x with elements dropped and the rest scaled by 1 / (1 - rate).
    """

    def call(self, inputs, training=False):
        width = inputs.shape[-1]
        if (not training or self.rate <= 0 or self.noise_shape is not None or width is None
                or width % 2):
            return super().call(inputs, training=training)
        seed = tf.cast(self.seed_generator.next(), tf.int64)
        shape = tf.shape(inputs)
        bits = tf.random.stateless_uniform(tf.concat([shape[:-1], [width // 2]], 0), seed,
                                           minval=None, maxval=None, dtype=tf.uint32)
        bits = tf.reshape(tf.bitcast(bits, tf.uint16), shape)
        keep = bits >= tf.constant(round(self.rate * 2**16), tf.uint16)
        scaled = inputs * tf.cast(1.0 / (1.0 - self.rate), inputs.dtype)
        return tf.where(keep, scaled, tf.zeros_like(inputs))
