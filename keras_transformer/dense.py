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
        if len(inputs.shape) > 2:
            leading = ops.shape(inputs)[:-1]
            outputs = self.call(ops.reshape(inputs, (-1, inputs.shape[-1])), training=training)
            return ops.reshape(outputs, (*leading, self.units))
        if not sums_bias_gradient_by_product(self):
            return super().call(inputs, training=training)
        return bias_and_activation(ops.matmul(inputs, self.kernel), self.bias,
                                   relu=self.activation is keras.activations.relu)

    def quantize(self, mode=None, type_check=True, **kwargs):
        # Keras quantizes no subclass of Dense (it cannot know what their `call` does); this
        # one's quantized call is Dense's own.
        super().quantize(mode, type_check=False, **kwargs)


def sums_bias_gradient_by_product(dense):
    """Whether `dense` adds its bias (and applies its ReLU) through `bias_and_activation`: on
    TensorFlow, under a bfloat16 compute dtype on CPUs, for a bias with no activation or a
    ReLU, unquantized. There TensorFlow's bias gradient sums the rows in bfloat16, far from
    the float32 sum, and more slowly than the product with a row of ones that oneDNN
    accumulates in float32 (benchmarks/results/bias_gradient.md)."""
    if not (dense.bias is not None and dense.compute_dtype == "bfloat16"
            and dense.quantization_mode is None and dense.lora_rank is None
            and dense.activation in (keras.activations.linear, keras.activations.relu)
            and keras.backend.backend() == "tensorflow"):
        return False
    from keras_transformer.compiled import on_cpus_only  # imports TensorFlow

    return on_cpus_only()


def bias_and_activation(x, bias, relu):
    """x + bias, then ReLU if `relu`, as Keras' Dense computes them (one BiasAdd, which
    TensorFlow's graph optimizer fuses into the product before it), with the bias gradient
    computed as ones [1, N] @ upstream [N, units] (TensorFlow only).

    Args: x [N, units]; bias [units], in x's dtype.
    Returns: [N, units].
    """
    import tensorflow as tf

    @tf.custom_gradient
    def add(x, bias):
        outputs = tf.nn.bias_add(x, bias)
        if relu:
            outputs = tf.nn.relu(outputs)

        def gradient(upstream):
            if relu:
                upstream = tf.raw_ops.ReluGrad(gradients=upstream, features=outputs)
            ones = tf.ones([1, tf.shape(upstream)[0]], upstream.dtype)
            return upstream, tf.reshape(tf.matmul(ones, upstream), [-1])

        return outputs, gradient

    # A tensor, not the variable: TensorFlow's custom gradient would otherwise ask for the
    # variable's gradient apart from the inputs'.
    return add(x, tf.cast(tf.convert_to_tensor(bias), x.dtype))
