"""Layer normalization (Ba et al., 2016), the "Norm" of every sub-layer's Add & Norm (§3.1)."""

import functools

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


def compiles_add_and_norm(x, dropout, norm, training, where_faster_only=True):
    """Whether `compiled_add_and_norm` serves this Add & Norm of x [..., d]: in training, with
    dropout, on TensorFlow, under a bfloat16 compute dtype, where it was measured faster than
    the separate ops (`compiled.add_and_norm_pays_here`: CPUs with native bfloat16). There
    TensorFlow's bfloat16 elementwise kernels are 2-8x slower than its float32 ones, and the
    Add & Norms' passes over [tokens, d] were, after the matrix products and the loss, the
    step's largest part; in float32 the compiled form was slower
    (benchmarks/results/add_and_norm.md). `where_faster_only=False` leaves the machine out
    (benchmarks.step_ablation measures it so elsewhere)."""
    if not (training is True and dropout.rate > 0 and dropout.noise_shape is None
            and keras.backend.backend() == "tensorflow" and norm.compute_dtype == "bfloat16"
            and norm.axis in ([-1], [len(x.shape) - 1]) and norm.center and norm.scale
            and x.shape[-1] is not None and x.shape[-1] % 2 == 0):
        return False
    from keras_transformer.compiled import add_and_norm_pays_here

    return not where_faster_only or add_and_norm_pays_here()


def compiled_add_and_norm(x, sublayer_output, dropout, norm):
    """Training's Add & Norm, LayerNorm(x + Dropout(sublayer_output)) (§3.1, §5.4), as one
    XLA-compiled pass forward and one backward (TensorFlow only; `compiles_add_and_norm` says
    when). The dropout mask is the one `dropout` draws on TensorFlow (16-bit random numbers
    from its seed generator, an element dropped below round(rate * 2^16), dropout.py); the
    norm is `norm`'s (its gamma, beta and epsilon; statistics in float32). The sum x +
    dropped output is formed in float32 (the separate layers round it to bfloat16 first).

    Args: x, sublayer_output [..., d] bfloat16, d even.
    Returns: [..., d] bfloat16.
    """
    import tensorflow as tf

    from keras_transformer.compiled import padding_rows
    from keras_transformer.dropout import halfword_threshold_and_scale, random_halfwords

    forward, backward = _add_and_norm_functions()
    shape, d = tf.shape(x), x.shape[-1]
    flat_x = tf.reshape(x, [-1, d])
    flat_y = tf.reshape(tf.cast(sublayer_output, x.dtype), [-1, d])
    rows = tf.shape(flat_x)[0]
    padding = [[0, padding_rows(rows)], [0, 0]]
    # Each 32-bit word is split into the 16-bit numbers of two neighbouring elements outside
    # the compiled passes, where the split is free (inside them it tripled the cost of the
    # masked sum).
    bits = random_halfwords(dropout.seed_generator, [rows + padding[0][1], d])
    threshold, scale = halfword_threshold_and_scale(dropout.rate)
    mask = (threshold, tf.constant(scale))
    epsilon = tf.constant(norm.epsilon, tf.float32)

    @tf.custom_gradient
    def add_and_norm(flat_x, flat_y, gamma, beta):
        padded_x, padded_y = tf.pad(flat_x, padding), tf.pad(flat_y, padding)
        outputs, mean, inverse_std = forward(padded_x, padded_y, bits, *mask, gamma, beta,
                                             epsilon)

        def gradient(upstream):
            d_x, d_y, d_gamma, d_beta = backward(padded_x, padded_y, bits, *mask, gamma, mean,
                                                 inverse_std, tf.pad(upstream, padding))
            return d_x[:rows], d_y[:rows], d_gamma, d_beta

        return outputs[:rows], gradient

    # Their values, not the variables (see LayerNorm.call).
    outputs = add_and_norm(flat_x, flat_y, tf.identity(norm.gamma), tf.identity(norm.beta))
    return tf.reshape(outputs, shape)


@functools.cache
def _add_and_norm_functions():
    """The XLA-compiled halves of `compiled_add_and_norm`, on [N, d] rows:
    forward(x, y, bits [N, d] uint16, threshold, scale, gamma, beta, epsilon) -> (outputs,
    mean [N], inverse_std [N]); backward(x, y, bits, threshold, scale, gamma, mean,
    inverse_std, upstream) -> (d_x, d_y, d_gamma, d_beta). bits[i, j] decides element [i, j].

    The sums over a row are products with a vector of ones: XLA's CPU code for a row
    reduction adds one element at a time, its matrix-vector product does not. The sums over
    the rows (gamma's and beta's gradients) take two reductions over leading axes instead,
    [N / 8, 8, d] -> [8, d] -> [d] (N is a multiple of 8, `compiled.ROW_MULTIPLE`): a
    product with a vector of ones was as fast only at 4,096 rows and more
    (benchmarks/results/add_and_norm.md)."""
    import tensorflow as tf

    from keras_transformer.compiled import ROW_MULTIPLE, rounded, widened

    def summed(x, y, bits, threshold, scale):
        """(x + mask * y, mask) in float32."""
        mask = tf.where(bits >= threshold, scale, 0.0)
        return widened(x) + mask * widened(y), mask

    def row_mean(t):
        return tf.linalg.matvec(t, tf.fill([t.shape[-1]], 1.0 / t.shape[-1]))

    def column_sum(t):
        return tf.reduce_sum(tf.reduce_sum(tf.reshape(t, [-1, ROW_MULTIPLE, t.shape[-1]]), 0), 0)

    @tf.function(jit_compile=True, autograph=False)
    def forward(x, y, bits, threshold, scale, gamma, beta, epsilon):
        total, _ = summed(x, y, bits, threshold, scale)
        mean = row_mean(total)
        centered = total - mean[:, None]
        inverse_std = tf.math.rsqrt(row_mean(tf.square(centered)) + epsilon)
        normalized = centered * inverse_std[:, None]
        return rounded(normalized * gamma + beta, x.dtype), mean, inverse_std

    @tf.function(jit_compile=True, autograph=False)
    def backward(x, y, bits, threshold, scale, gamma, mean, inverse_std, upstream):
        total, mask = summed(x, y, bits, threshold, scale)
        normalized = (total - mean[:, None]) * inverse_std[:, None]
        d_out = widened(upstream)
        g = d_out * gamma
        # As in `layer_norm`'s gradient; the sum's gradient goes to x as it is, to y masked.
        d_total = (g - row_mean(g)[:, None]
                   - normalized * row_mean(g * normalized)[:, None]) * inverse_std[:, None]
        return (rounded(d_total, x.dtype), rounded(d_total * mask, y.dtype),
                column_sum(d_out * normalized), column_sum(d_out))

    return forward, backward
