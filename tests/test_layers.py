"""LayerNorm, Dropout and the residual connection against independent computations; the
fused Adam against Keras'."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt


@pytest.mark.parametrize("policy, atol", [("float32", 1e-5), ("mixed_bfloat16", 0.05)])
def test_layer_norm_matches_numpy_and_its_gradient_keras(rng, policy, atol):
    x = tf.constant(rng.normal(size=(3, 5, 8)) * 2 + 1, tf.float32)
    upstream = tf.constant(rng.normal(size=(3, 5, 8)), tf.float32)
    gamma, beta = rng.normal(size=8), rng.normal(size=8)
    ours = kt.LayerNorm(1e-6, dtype=policy)
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)
    results = []
    for layer in (ours, reference):
        layer.build(x.shape)
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        grads = tape.gradient(loss, [x, layer.gamma.value, layer.beta.value])
        results.append([tf.cast(t, tf.float32).numpy() for t in [y] + grads])
    x_np = x.numpy()
    normed = (x_np - x_np.mean(-1, keepdims=True)) / np.sqrt(x_np.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(results[0][0], normed * gamma + beta, atol=atol * 4)
    assert results[0][0].dtype == np.float32 and ours(x).dtype == ours.compute_dtype
    for got, expected in zip(results[0], results[1]):
        np.testing.assert_allclose(got, expected, atol=atol)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_dropout_rate_scale_and_gradient(policy):
    rate = 0.1
    layer = kt.Dropout(rate, seed=3, dtype=policy)
    dtype = layer.compute_dtype
    x = tf.cast(tf.fill([64, 32, 256], 2.0), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy().astype(np.float32)
    y = y.numpy().astype(np.float32)
    dropped = np.mean(y == 0)
    n = y.size
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n)  # a binomial's 4 sigma
    kept = y[y != 0]
    scale = tf.cast(1 / 0.9, dtype)
    np.testing.assert_allclose(kept, np.float32(tf.cast(2.0, dtype) * scale), rtol=0)
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


@pytest.mark.parametrize("accumulate", [None, 2])
def test_fused_adam_matches_keras_adam(rng, accumulate):
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
    assert isinstance(kt.make_optimizer(0.01), kt.FusedAdam)
    assert not np.allclose(finals[0], start)
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_is_post_ln_or_pre_ln_and_passes_extras_through(rng, norm_first):
    """§3.1: LayerNorm(x + Sublayer(x)); pre-LN: x + Sublayer(LayerNorm(x)) (dropout off at
    inference); a sub-layer's cache comes back with the new output."""
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    gamma, beta = rng.normal(size=8), rng.normal(size=8)
    residual = kt.Residual(dropout=0.3, norm_first=norm_first)
    residual.build(x.shape)
    residual.norm.gamma.assign(gamma)
    residual.norm.beta.assign(beta)

    def layer_norm(v):
        normed = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-6)
        return normed * gamma + beta

    expected = x + layer_norm(x) @ w if norm_first else layer_norm(x + x @ w)
    out = residual(tf.constant(x), sublayer=lambda y: tf.matmul(y, w), training=False)
    np.testing.assert_allclose(out, expected, atol=1e-4)
    cache = {"key": tf.ones([1])}
    with_cache = residual(tf.constant(x), sublayer=lambda y: kt.WithCache(tf.matmul(y, w), cache),
                          training=False)
    assert isinstance(with_cache, kt.WithCache) and with_cache.cache is cache
    np.testing.assert_allclose(with_cache.outputs, expected, atol=1e-4)
