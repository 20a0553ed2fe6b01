"""The layer norm, Dropout, the position-wise Dense, and the encoder and decoder layers'
residual connections against independent computations; the token-weighted Adam against Keras'
and NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.dense import sums_bias_gradient_by_product


@pytest.mark.parametrize("policy, atol", [("float32", 1e-5), ("mixed_bfloat16", 0.05)])
def test_layer_norm_and_its_gradient_match_numpy(rng, policy, atol):
    """The norm of every residual connection (§3.1), in float32 and under mixed_bfloat16,
    against NumPy: the output and the closed-form gradients of x, gamma and beta."""
    x = tf.constant(rng.normal(size=(3, 5, 8)) * 2 + 1, tf.float32)
    upstream = rng.normal(size=(3, 5, 8))
    gamma, beta = rng.normal(size=8), rng.normal(size=8)
    norm = kt.EncoderLayer(2, 16, dtype=policy).make_norm("norm")
    norm.build(x.shape)
    norm.gamma.assign(gamma)
    norm.beta.assign(beta)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = norm(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.constant(upstream, tf.float32))
    grads = tape.gradient(loss, [x, norm.gamma.value, norm.beta.value])
    assert y.dtype == norm.compute_dtype and norm.gamma.dtype == "float32"
    x_np = x.numpy()
    sigma = np.sqrt(x_np.var(-1, keepdims=True) + 1e-6)
    normed = (x_np - x_np.mean(-1, keepdims=True)) / sigma
    g = upstream * gamma
    dx = (g - g.mean(-1, keepdims=True) - normed * (g * normed).mean(-1, keepdims=True)) / sigma
    expected = [normed * gamma + beta, dx, (upstream * normed).sum((0, 1)), upstream.sum((0, 1))]
    for got, want in zip([y] + grads, expected):
        np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want,
                                   atol=atol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_layer_norm_equals_keras_layer_normalization(rng, policy):
    """`LayerNorm`'s written-out gradient against autodiff through Keras' own layer of the
    same weights, on a rank-4 input; its config makes the same layer again."""
    x = tf.constant(rng.normal(size=(2, 3, 4, 8)) * 3 - 1, tf.float32)
    upstream = tf.constant(rng.normal(size=(2, 3, 4, 8)), tf.float32)
    ours = kt.LayerNorm(epsilon=1e-3, dtype=policy)
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-3, dtype=policy)
    results = []
    for norm in (ours, keras_norm):
        norm.build(x.shape)
        norm.set_weights([rng.normal(size=8), rng.normal(size=8)] if norm is ours
                         else ours.get_weights())
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        results.append([tf.cast(t, tf.float32).numpy()
                        for t in [y, *tape.gradient(loss, [x, norm.gamma.value, norm.beta.value])]])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    again = kt.LayerNorm.from_config(ours.get_config())
    assert (again.epsilon, again.dtype_policy.name) == (1e-3, policy)


@pytest.mark.parametrize("policy, width", [("float32", 256), ("mixed_bfloat16", 256),
                                           ("float32", 255)])
def test_dropout_rate_scale_and_gradient(policy, width):
    rate = 0.1
    layer = kt.Dropout(rate, seed=3, dtype=policy)
    dtype = layer.compute_dtype
    x = tf.cast(tf.fill([64, 32, width], 2.0), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy().astype(np.float32)
    y = y.numpy().astype(np.float32)
    dropped = np.mean(y == 0)
    n = y.size
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n)  # a binomial's 4 sigma
    kept = y[y != 0]
    # The rate as a 16-bit threshold, the kept elements scaled to keep the expectation.
    scale = tf.cast(2**16 / (2**16 - round(rate * 2**16)), dtype)
    np.testing.assert_allclose(kept, np.float32(tf.cast(2.0, dtype) * scale), rtol=0)
    np.testing.assert_allclose(np.mean(y), 2.0, rtol=0.01)  # the expectation kept
    np.testing.assert_array_equal(grad == 0, y == 0)  # the same mask backwards
    # Every element an independent draw: no pattern along the paired 16-bit halves.
    pairs = (y.reshape(-1, 2) == 0)
    assert abs(np.mean(pairs[:, 0] & pairs[:, 1]) - rate**2) < 4 * np.sqrt(rate**2 / (n / 2))
    assert not np.array_equal(layer(x, training=True).numpy(), y)  # a new mask each call
    np.testing.assert_array_equal(layer(x, training=False), x)


def test_dropout_masks_follow_the_seed_state():
    a, b = kt.Dropout(0.3, seed=7), kt.Dropout(0.3, seed=7)
    x = tf.ones([4, 6])
    np.testing.assert_array_equal(a(x, training=True), b(x, training=True))
    b.seed_generator.state.assign(a.seed_generator.state.value)
    np.testing.assert_array_equal(a(x, training=True), b(x, training=True))


def test_compiled_add_and_norm_matches_numpy_and_keras_given_its_bits(rng):
    """Training's compiled Add & Norm under mixed_bfloat16 (layer_norm.py), given its random
    bits: the output against NumPy's LayerNorm(x + mask * y), mask = 1 / (1 - rate) where an
    element's 16-bit number reaches round(rate * 2^16), else 0; the gradients of x, y, gamma
    and beta against autodiff through Keras' LayerNormalization in float32 on the same sum."""
    from keras_transformer.layer_norm import _add_and_norm_functions

    rows, d, rate = 24, 16, 0.3
    x = tf.cast(rng.normal(size=(rows, d)) * 2 + 1, tf.bfloat16)
    y = tf.cast(rng.normal(size=(rows, d)), tf.bfloat16)
    bits = rng.integers(0, 2**16, size=(rows, d), dtype=np.uint16)
    gamma, beta = rng.normal(size=d).astype(np.float32), rng.normal(size=d).astype(np.float32)
    upstream = tf.cast(rng.normal(size=(rows, d)), tf.bfloat16)
    threshold = round(rate * 2**16)
    scale = 2**16 / (2**16 - threshold)
    forward, backward = _add_and_norm_functions()
    mask_args = (tf.constant(threshold, tf.uint16), tf.constant(scale, tf.float32))
    out, mean, inverse_std = forward(x, y, tf.constant(bits), *mask_args, gamma, beta,
                                     tf.constant(1e-6))
    grads = backward(x, y, tf.constant(bits), *mask_args, gamma, mean, inverse_std, upstream)

    mask = np.where(bits >= threshold, scale, 0.0)
    assert 0.15 < np.mean(mask == 0) < 0.45  # rate 0.3 over 384 elements
    x64, y64 = (tf.cast(t, tf.float64).numpy() for t in (x, y))
    total = x64 + mask * y64
    normed = (total - total.mean(-1, keepdims=True)) / np.sqrt(total.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(tf.cast(out, tf.float32), normed * gamma + beta,
                               atol=0.02 * np.abs(normed * gamma + beta).max())

    keras_norm = keras.layers.LayerNormalization(epsilon=1e-6)
    keras_norm.build((None, d))
    keras_norm.set_weights([gamma, beta])
    x32, y32 = tf.cast(x, tf.float32), tf.cast(y, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([x32, y32])
        loss = tf.reduce_sum(keras_norm(x32 + tf.constant(mask, tf.float32) * y32)
                             * tf.cast(upstream, tf.float32))
    expected = tape.gradient(loss, [x32, y32, keras_norm.gamma, keras_norm.beta])
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(tf.cast(got, tf.float32), want,
                                   atol=0.02 * np.abs(want.numpy()).max())


def test_compiled_add_and_norm_drops_at_the_rate_and_follows_the_seed_state(rng):
    """Through `compiled_add_and_norm` as the layers call it (a row count that is padded):
    it serves training under mixed_bfloat16 only; y's gradient is dropped at the rate (a
    binomial's 4 sigma) and elsewhere the kept scale times x's; gamma's and beta's gradients
    hold the real rows only; the mask follows the dropout's seed state."""
    from keras_transformer.layer_norm import compiled_add_and_norm, compiles_add_and_norm

    rate, d = 0.1, 256
    dropout = kt.Dropout(rate, seed=5, dtype="mixed_bfloat16")
    norm = kt.LayerNorm(dtype="mixed_bfloat16")
    norm.build((None, d))
    x = tf.cast(rng.normal(size=(40, 53, d)), tf.bfloat16)  # 2,120 rows, padded to 2,304
    y = tf.cast(rng.normal(size=(40, 53, d)), tf.bfloat16)
    upstream = tf.constant(rng.normal(size=(40, 53, d)), tf.float32)
    everywhere = dict(where_faster_only=False)
    assert compiles_add_and_norm(x, dropout, norm, True, **everywhere)
    assert not compiles_add_and_norm(x, dropout, norm, False, **everywhere)
    assert not compiles_add_and_norm(x, dropout, kt.LayerNorm(dtype="float32"), True,
                                     **everywhere)
    assert not compiles_add_and_norm(x, kt.Dropout(0.0, dtype="mixed_bfloat16"), norm, True,
                                     **everywhere)
    state = dropout.seed_generator.state.numpy()
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        out = compiled_add_and_norm(x, y, dropout, norm)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * upstream)
    d_x, d_y, _, d_beta = tape.gradient(loss, [x, y, norm.gamma, norm.beta])
    assert out.shape == x.shape and out.dtype == tf.bfloat16
    d_x, d_y = (tf.cast(t, tf.float32).numpy() for t in (d_x, d_y))
    dropped = np.mean(d_y == 0)
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / d_y.size)
    kept = d_y != 0
    np.testing.assert_allclose(d_y[kept], d_x[kept] / (1 - rate), rtol=0.01, atol=1e-3)
    rounded_upstream = tf.cast(tf.cast(upstream, tf.bfloat16), tf.float64).numpy()  # out's
    np.testing.assert_allclose(d_beta, rounded_upstream.sum((0, 1)), rtol=1e-4, atol=1e-3)
    again = compiled_add_and_norm(x, y, dropout, norm)
    assert not np.array_equal(again.numpy(), out.numpy())  # a new mask each call
    dropout.seed_generator.state.assign(state)
    np.testing.assert_array_equal(compiled_add_and_norm(x, y, dropout, norm).numpy(),
                                  out.numpy())


@pytest.mark.parametrize("flags, compiled", [({"avx2", "avx512_bf16", "amx_bf16"}, True),
                                             ({"avx2", "avx512_bf16"}, True), ({"avx2"}, False),
                                             (set(), False)])
def test_add_and_norm_is_compiled_by_default_on_cpus_with_native_bfloat16(monkeypatch, flags,
                                                                          compiled):
    """Where the compiled Add & Norm was measured faster (benchmarks/results/add_and_norm.md):
    CPUs with AMX-BF16 or AVX512-BF16 (this test machine has no GPU), not where TensorFlow
    emulates bfloat16."""
    from keras_transformer import compiled as compiled_module
    from keras_transformer.layer_norm import compiles_add_and_norm

    monkeypatch.setattr(compiled_module, "cpu_flags", lambda: flags)
    compiled_module.add_and_norm_pays_here.cache_clear()
    try:
        dropout = kt.Dropout(0.1, dtype="mixed_bfloat16")
        norm = kt.LayerNorm(dtype="mixed_bfloat16")
        norm.build((None, 8))
        x = tf.zeros((2, 3, 8), tf.bfloat16)
        assert compiles_add_and_norm(x, dropout, norm, True) is compiled
    finally:
        compiled_module.add_and_norm_pays_here.cache_clear()


@pytest.mark.parametrize("accumulate", [None, 2])
def test_token_weighted_adam_matches_keras_adam(rng, accumulate):
    start = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(6)]
    finals = []
    for optimizer in (kt.make_optimizer(0.01, gradient_accumulation_steps=accumulate),
                      keras.optimizers.Adam(0.01, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                                            gradient_accumulation_steps=accumulate)):
        variable = keras.Variable(start)
        for grad in grads:
            optimizer.apply_gradients([(tf.constant(grad), variable)])
        finals.append(variable.numpy())
    assert isinstance(kt.make_optimizer(0.01), kt.TokenWeightedAdam)
    assert not np.allclose(finals[0], start)
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_dense_equals_keras_dense_on_every_position(rng, quantize):
    """The position-wise Dense (a 2-D matmul over the flattened positions) against Keras'
    Dense with the same weights on [B, T, d] and [B, d] inputs, quantized to int8 too; the
    weights keep Keras' names, so checkpoints load either way."""
    ours, theirs = kt.Dense(6, activation="relu"), keras.layers.Dense(6, activation="relu")
    for layer in (ours, theirs):
        layer.build((None, 8))
    theirs.set_weights([rng.normal(size=w.shape) for w in theirs.get_weights()])
    ours.set_weights(theirs.get_weights())
    assert [w.path for w in ours.weights] == [w.path.replace(theirs.name, ours.name)
                                             for w in theirs.weights]
    if quantize:
        ours.quantize(quantize)
        theirs.quantize(quantize)
        assert ours.quantization_mode == quantize
    for shape in ((3, 5, 8), (4, 8)):
        x = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", [None, "relu"])
def test_dense_bias_gradient_by_product_matches_keras_dense(rng, activation):
    """Under mixed_bfloat16 on CPUs the position-wise Dense adds its bias with the bias
    gradient as a product with a row of ones (dense.bias_and_activation); its outputs and the
    gradients of the inputs, kernel and bias, traced as in training, against Keras' Dense
    differentiated by TensorFlow, with the same weights."""
    ours = kt.Dense(48, activation=activation, dtype="mixed_bfloat16")
    theirs = keras.layers.Dense(48, activation=activation, dtype="mixed_bfloat16")
    for layer in (ours, theirs):
        layer.build((None, 32))
    theirs.set_weights([rng.normal(size=w.shape) * 0.3 for w in theirs.get_weights()])
    ours.set_weights(theirs.get_weights())
    assert sums_bias_gradient_by_product(ours)
    gelu = kt.Dense(4, activation="gelu", dtype="mixed_bfloat16")
    gelu.build((None, 8))
    assert not sums_bias_gradient_by_product(gelu)
    x = tf.constant(rng.normal(size=(3, 40, 32)), tf.float32)
    upstream = tf.constant(rng.normal(size=(3, 40, 48)), tf.float32)

    @tf.function
    def outputs_and_gradients(layer):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        return [tf.cast(y, tf.float32)] + tape.gradient(loss, [x, *layer.trainable_variables])

    for got, want in zip(outputs_and_gradients(ours), outputs_and_gradients(theirs)):
        # Both in bfloat16 with float32 sums; they differ by the sums' order and roundings.
        np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want.numpy()).max())


def adam_in_numpy(start, grads, lr, beta_1=0.9, beta_2=0.98, epsilon=1e-9, amsgrad=False):
    """Adam as Kingma & Ba (2015) write it (Algorithm 1, with section 2's bias correction in
    the step size), and AMSGrad's running maximum of v."""
    x, m, v, v_max = start.astype(np.float64), 0.0, 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        v_max = np.maximum(v_max, v)
        step_size = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        x = x - step_size * m / (np.sqrt(v_max if amsgrad else v) + epsilon)
    return x


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_token_weighted_adam_follows_kingma_and_ba(rng, strategy, amsgrad, two_cpu_replicas):
    """The update (TensorFlow's fused op per variable; Keras' ops with amsgrad) against NumPy,
    on one device and under MirroredStrategy with two replicas, each handed half of every
    gradient (Keras sums the replicas' gradients)."""
    start = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(4)]
    strategy = two_cpu_replicas if strategy == "mirrored" else tf.distribute.get_strategy()
    with strategy.scope():
        optimizer = kt.make_optimizer(0.01, epsilon=1e-7, amsgrad=amsgrad)
        variable = keras.Variable(start)
        optimizer.build([variable])

    @tf.function
    def apply(grad):
        # tf.identity: the gradient each replica hands over is made on its device, as in a
        # step (the all-reduce needs one).
        strategy.run(lambda g: optimizer.apply_gradients([(tf.identity(g), variable)]),
                     args=(grad,))

    for grad in grads:
        apply(tf.constant(grad / strategy.num_replicas_in_sync))
    expected = adam_in_numpy(start, grads, 0.01, epsilon=1e-7, amsgrad=amsgrad)
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == len(grads)
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inner", ["sgd", "token_weighted_adam"])
def test_loss_scaling_drops_an_overflowing_update_but_counts_its_step(inner):
    """Issue 23, item 8 (mixed_float16): gradients that overflow skip the update, as in
    Keras, but the step count still advances, so steps stay equal to the batches consumed.
    Under accumulation an overflowing first micro-batch adds nothing and an overflowing last
    one drops its update. The weights are checked against plain SGD arithmetic in NumPy (the
    micro-batches kept, each averaged over the 2 accumulation steps)."""
    if inner == "sgd":
        optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    else:
        optimizer = kt.make_optimizer(0.1, gradient_accumulation_steps=2)
        optimizer.micro_batch_tokens = tf.constant(5.0)
    scaled = kt.TokenWeightedLossScaleOptimizer(optimizer, initial_scale=8.0)
    inf = np.inf
    cycles = [([1, 2, 3], [3, 2, 1]), ([1, 1, 1], [inf, 0, 0]), ([inf, 0, 0], [2, 2, 4])]
    variable = keras.Variable(np.ones(3, np.float32))
    for micro_batches in cycles:
        for grad in micro_batches:
            scale = float(scaled.dynamic_scale) if scaled.built else 8.0
            scaled.apply([tf.constant(grad, tf.float32) * scale], [variable])
    assert int(scaled.iterations) == 3 and int(optimizer._iterations) == 6
    assert float(scaled.dynamic_scale) == 2.0  # halved by each overflow
    if inner == "sgd":
        expected = 1 - 0.1 * (np.add([1, 2, 3], [3, 2, 1]) / 2 + np.array([2, 2, 4]) / 2)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
    else:
        assert np.all(np.isfinite(variable.numpy()))
        assert float(optimizer._accumulated_tokens) == 0.0  # the dropped update's tokens too


def numpy_layer_norm(x, norm):
    normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    return normed * norm.gamma.numpy() + norm.beta.numpy()


def numpy_feed_forward(layer, x):
    (w1, b1), (w2, b2) = [[w.numpy() for w in dense.weights] for dense in (layer.inner,
                                                                          layer.outer)]
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def numpy_sublayer(x, sublayer, norm, norm_first):
    """§3.1: LayerNorm(x + Sublayer(x)); pre-LN: x + Sublayer(LayerNorm(x))."""
    if norm_first:
        return x + sublayer(numpy_layer_norm(x, norm))
    return numpy_layer_norm(x + sublayer(x), norm)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_layers_match_numpy(rng, norm_first):
    """Each sub-layer in its residual connection and norm, post-LN (the paper) or pre-LN,
    against NumPy on the layers' own weights (dropout off at inference); the decoder layer's
    self-attention is causal and its encoder-decoder attention sees the memory's real
    positions only."""
    from test_attention import numpy_multi_head

    x, memory = rng.normal(size=(2, 5, 16)), rng.normal(size=(2, 6, 16))
    memory_mask = np.ones((2, 6), bool)
    memory_mask[1, 4:] = False
    settings = dict(num_heads=4, d_ff=32, dropout=0.3, norm_first=norm_first)
    for layer in (kt.EncoderLayer(**settings), kt.DecoderLayer(**settings)):
        is_decoder = isinstance(layer, kt.DecoderLayer)

        def call():
            inputs = tf.constant(x, tf.float32)
            if not is_decoder:
                return layer(inputs, training=False)
            return layer(inputs, tf.constant(memory, tf.float32), kt.causal_mask(5, 5)[None],
                         tf.constant(memory_mask[:, None]), training=False)

        call()  # builds the weights
        for weight in layer.weights:
            if weight.name in ("gamma", "beta"):  # not a fresh norm's identity
                weight.assign(rng.normal(size=weight.shape))
        out = call()

        def self_attention(y):
            mask = np.tril(np.ones((5, 5), bool)) if is_decoder else np.ones((5, 5), bool)
            return numpy_multi_head(layer.self_attention, y, y, np.broadcast_to(mask, (2, 5, 5)),
                                    4, 4, 4)[0]

        def cross_attention(y):
            return numpy_multi_head(layer.cross_attention, y, memory,
                                    np.broadcast_to(memory_mask[:, None], (2, 5, 6)), 4, 4, 4)[0]

        expected = numpy_sublayer(x, self_attention, layer.self_attention_norm, norm_first)
        if is_decoder:
            expected = numpy_sublayer(expected, cross_attention, layer.cross_attention_norm,
                                      norm_first)
        expected = numpy_sublayer(expected, lambda y: numpy_feed_forward(layer.feed_forward, y),
                                  layer.feed_forward_norm, norm_first)
        np.testing.assert_allclose(out, expected, atol=1e-4, err_msg=type(layer).__name__)


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_encoder_on_real_tokens_only_matches_the_padded_encoder(rng, monkeypatch, num_kv_heads):
    """In training on CPUs the encoder runs its position-wise sub-layers on the real tokens
    only (keras_transformer/packing.py); its memory at real positions and every gradient
    against the same encoder computed over the padded [B, S] layout, its memory zero at
    padded positions."""
    from keras_transformer import encoder as encoder_module
    from keras_transformer.packing import ROWS_MULTIPLE, RealTokens

    encoder = kt.Encoder(2, 4, 32, num_kv_heads=num_kv_heads, dropout=0.0)
    encoder.build((None, None, 16))
    lengths = [7, 2, 5, 1]
    padding = np.arange(7)[None, :] < np.array(lengths)[:, None]
    embeddings = tf.constant(rng.normal(size=(4, 7, 16)), tf.float32)
    upstream = tf.constant(rng.normal(size=(4, 7, 16)) * padding[..., None], tf.float32)
    packs = encoder_module.packs_real_tokens
    assert packs(tf.constant(padding), True, where_faster_only=False)
    # 15 real tokens in rows padded with zero rows to a multiple of ROWS_MULTIPLE.
    rows = RealTokens(tf.constant(padding)).pack(embeddings).numpy()
    assert rows.shape[0] % ROWS_MULTIPLE == 0 and rows.shape[0] > padding.sum()
    np.testing.assert_array_equal(rows[:padding.sum()], embeddings.numpy()[padding])
    assert not rows[padding.sum():].any()
    assert not packs(tf.constant(padding), False, where_faster_only=False)

    def memory_and_gradients():
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            memory = encoder(embeddings, tf.constant(padding), training=True)
            loss = tf.reduce_sum(memory * upstream)
        return memory.numpy(), tape.gradient(loss, [embeddings, *encoder.trainable_variables])

    # Packed on any machine (the library packs on CPUs only), then padded.
    monkeypatch.setattr(encoder_module, "packs_real_tokens",
                        lambda *args: packs(*args, where_faster_only=False))
    packed, packed_gradients = memory_and_gradients()
    monkeypatch.setattr(encoder_module, "packs_real_tokens", lambda *args: False)
    padded, padded_gradients = memory_and_gradients()
    np.testing.assert_allclose(packed[padding], padded[padding], rtol=1e-5, atol=1e-5)
    assert not packed[~padding].any()
    assert len(packed_gradients) == 1 + 2 * 16  # the embeddings, then 16 weights a layer
    for ours, theirs in zip(packed_gradients, padded_gradients):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
