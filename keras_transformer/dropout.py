"""Dropout (§5.4: residual dropout on every sub-layer output and on the embedding sums)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (the same seed generator, so weight files carry its state)
    whose rate holds under mixed_bfloat16: Keras draws its uniform numbers in the compute
    dtype, and a bfloat16 uniform drops 10.2% for a rate of 0.1 (tests/test_layers.py checks
    the rate). On TensorFlow an element is dropped when its 16-bit random number
    (`random_halfwords`) is below round(rate * 2^16), the rate to within 2^-16, and the kept
    ones are scaled by 2^16 / (2^16 - that threshold), so that the expectation is unchanged.
    That takes half the random words of float32 uniforms, whose draws led the float32 step's
    ops besides the matrix products (benchmarks/results/dropout_bits.md). Other backends draw
    float32 uniforms. Falls back to Keras for `noise_shape`.

    Call: x [..., d], training -> x with elements dropped and the rest scaled.
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        if keras.backend.backend() == "tensorflow":
            threshold, scale = halfword_threshold_and_scale(self.rate)
            bits = random_halfwords(self.seed_generator, ops.shape(inputs))
            keep = ops.where(bits >= threshold, ops.cast(scale, inputs.dtype),
                             ops.cast(0, inputs.dtype))
            return inputs * keep
        uniform = keras.random.uniform(ops.shape(inputs), dtype="float32",
                                       seed=self.seed_generator)
        # One product with a 0 or 1 / (1 - rate) mask: the same numbers as selecting between
        # the scaled inputs and zeros, and one product backward where that took a select too.
        keep = ops.cast(uniform >= self.rate, inputs.dtype)
        return inputs * (keep * ops.cast(1.0 / (1.0 - self.rate), inputs.dtype))


def halfword_threshold_and_scale(rate):
    """(threshold, scale) of dropout on 16-bit random numbers: an element is dropped below
    `threshold` = round(rate * 2^16) (a uint16 tensor) and kept ones are multiplied by
    `scale` = 2^16 / (2^16 - threshold) (a float), so the expectation is unchanged."""
    import tensorflow as tf

    threshold = round(rate * 2**16)
    return tf.constant(threshold, tf.uint16), 2**16 / (2**16 - threshold)


def random_halfwords(seed_generator, shape):
    """uint16 random numbers of `shape` (TensorFlow only), drawn from `seed_generator` as
    one 32-bit Philox word for each two neighbouring elements along the last axis."""
    import tensorflow as tf

    shape = tf.convert_to_tensor(shape, tf.int32)
    seed = tf.cast(tf.math.floormod(seed_generator.next(), tf.int32.max - 1), tf.int32)
    leading, last = shape[:-1], shape[-1]
    words = tf.random.stateless_uniform(tf.concat([leading, [(last + 1) // 2]], 0), seed,
                                        minval=None, maxval=None, dtype=tf.uint32)
    # [..., words, 2] halfwords, then [..., last]: the slice is a no-op for an even last axis.
    bits = tf.reshape(tf.bitcast(words, tf.uint16), tf.concat([leading, [-1]], 0))
    return bits[..., :last]
