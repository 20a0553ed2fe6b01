"""The position-wise linear map: one weight matrix applied at every position (§3.2.2's
projections, §3.3's two linear transformations)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` (the same weights, names and options) that applies its kernel to
    [..., d_in] inputs as one 2-D matmul over the flattened positions. Keras multiplies a
    rank-3 input by `tf.tensordot` on TensorFlow, whose shape arithmetic (and its gradient's)
    swells the training step's graph, which every run traces and optimises at its first step.

    Call: x [..., d_in] -> [..., units].
    """

    def call(self, inputs, training=None):
        if len(inputs.shape) <= 2:
            return super().call(inputs, training=training)
        leading = ops.shape(inputs)[:-1]
        outputs = super().call(ops.reshape(inputs, (-1, inputs.shape[-1])), training=training)
        return ops.reshape(outputs, (*leading, self.units))

    def quantize(self, mode=None, type_check=True, **kwargs):
        # Keras quantizes no subclass of Dense (it cannot know what their `call` does); this
        # one's quantized call is Dense's own.
        super().quantize(mode, type_check=False, **kwargs)
