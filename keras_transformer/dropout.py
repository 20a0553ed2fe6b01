"""Dropout (§5.4: residual dropout on every sub-layer output and on the embedding sums)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (the same seed generator, so weight files carry its state)
    that draws its uniform numbers in float32 whatever the compute dtype, so that the rate
    holds under mixed_bfloat16: Keras draws them in the compute dtype, and a bfloat16 uniform
    drops 10.2% for a rate of 0.1 (tests/test_layers.py checks the rate under
    mixed_bfloat16). Falls back to Keras for `noise_shape`.

    Call: x [..., d], training -> x with elements dropped and the rest scaled by 1 / (1 - rate).
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        uniform = keras.random.uniform(ops.shape(inputs), dtype="float32",
                                       seed=self.seed_generator)
        # One product with a 0 or 1 / (1 - rate) mask: the same numbers as selecting between
        # the scaled inputs and zeros, and one product backward where that took a select too.
        keep = ops.cast(uniform >= self.rate, inputs.dtype)
        return inputs * (keep * ops.cast(1.0 / (1.0 - self.rate), inputs.dtype))
