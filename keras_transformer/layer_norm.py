"""Layer normalization (Ba et al., 2016), the "Norm" of every sub-layer's Add & Norm (§3.1)."""

import keras
from keras import ops


def layer_norm(x, gamma, beta, epsilon):
    """(x - mean) / sqrt(variance + epsilon) * gamma + beta over the last axis, its statistics
    in float32 whatever x's dtype, returned in x's dtype; with its gradient written out.

    Autodiff through Keras' formulation takes about 40 ops a norm (broadcasts, reductions of
    each partial product), most of them passes over [tokens, d]; the closed form takes half
    as many. That matters where the matrix products are cheap (bfloat16 on CPUs that compute
    it natively): there the norms were the largest part of a training step after them.

    Args: x [..., d] (any float dtype); gamma, beta [d] float32.
    Returns: [..., d] in x's dtype.
    """

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        x32 = ops.cast(x, "float32")
        centered = x32 - ops.mean(x32, axis=-1, keepdims=True)
        inverse_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
        normalized = centered * inverse_std
        outputs = ops.cast(normalized * gamma + beta, x.dtype)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            d_out = ops.cast(upstream, "float32")
            positions = tuple(range(len(d_out.shape) - 1))
            d_gamma = ops.sum(d_out * normalized, axis=positions)
            d_beta = ops.sum(d_out, axis=positions)
            # d normalized = d_out * gamma; through the mean and the variance:
            # dx = (g - mean(g) - normalized * mean(g * normalized)) / std.
            g = d_out * gamma
            d_x = (g - ops.mean(g, axis=-1, keepdims=True)
                   - normalized * ops.mean(g * normalized, axis=-1, keepdims=True)) * inverse_std
            return ops.cast(d_x, x.dtype), d_gamma, d_beta

        return outputs, grad

    return normalize(x, gamma, beta)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (the same weights `gamma` and `beta` [d], names and
    options) whose call over the last axis is `layer_norm`: statistics in float32 under mixed
    precision, the result in the compute dtype. Other axes fall back to Keras.

    Call: x [..., d] -> [..., d].
    """

    def call(self, inputs):
        # (build has made self.axis a list)
        if self.axis not in ([-1], [len(inputs.shape) - 1]) or not (self.center and self.scale):
            return super().call(inputs)
        # Their values, not the variables: TensorFlow's custom gradient would otherwise ask
        # for the variables' gradients apart from the inputs'.
        outputs = layer_norm(inputs, ops.copy(self.gamma), ops.copy(self.beta), self.epsilon)
        return ops.cast(outputs, self.compute_dtype)
