import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids, small_config

import keras_transformer as kt
from keras_transformer import compiled


def numpy_label_smoothing(labels, logits, eps, pad_id=0):
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    target = np.full(logits.shape, eps / vocab)
    np.put_along_axis(target, labels[..., None], 1 - eps + eps / vocab, axis=-1)
    per_token = -(target * log_probs).sum(-1)
    real = labels != pad_id
    return per_token * real, per_token[real].mean()


def test_label_smoothing_matches_numpy(rng):
    labels = random_ids(rng, 4, 6, 11)
    logits = rng.normal(size=(4, 6, 11)) * 3
    loss = kt.LabelSmoothedCrossEntropy(0.1)
    ref_tokens, ref_mean = numpy_label_smoothing(labels, logits, 0.1)
    np.testing.assert_allclose(loss.call(tf.constant(labels), tf.constant(logits, tf.float32)),
                               ref_tokens, rtol=1e-5)
    np.testing.assert_allclose(loss(tf.constant(labels), tf.constant(logits, tf.float32)),
                               ref_mean, rtol=1e-5)


@pytest.mark.parametrize("cross_entropy", ["smoothed_cross_entropy",  # TensorFlow's kernel
                                           "smoothed_cross_entropy_formula"])  # other backends'
def test_label_smoothing_gradient_is_softmax_minus_smoothed_target(rng, cross_entropy):
    # Both ways of computing the loss, and their gradients, against the closed form of §5.4's
    # target, and against TensorFlow differentiating the dense cross-entropy itself.
    labels = random_ids(rng, 3, 5, 13)
    # Scale 100: many probabilities underflow to 0 in float32; the loss must stay finite.
    for scale, eps in [(3, 0.0), (3, 0.1), (3, 0.3), (100, 0.1)]:
        logits = tf.constant(rng.normal(size=(3, 5, 13)) * scale, tf.float32)
        weights = tf.constant(rng.uniform(size=(3, 5)), tf.float32)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(logits)
            ours = tf.reduce_sum(getattr(kt.losses, cross_entropy)(labels, logits, eps) * weights)
            target = tf.one_hot(labels, 13) * (1 - eps) + eps / 13
            dense = tf.reduce_sum(
                tf.nn.softmax_cross_entropy_with_logits(target, logits) * weights)
        np.testing.assert_allclose(ours, dense, rtol=1e-5)
        assert np.isfinite(ours)
        z = logits.numpy()
        softmax = np.exp(z - z.max(-1, keepdims=True))
        softmax /= softmax.sum(-1, keepdims=True)
        expected = (softmax - target.numpy()) * weights.numpy()[..., None]
        np.testing.assert_allclose(tape.gradient(ours, logits), expected, atol=1e-6)
        np.testing.assert_allclose(tape.gradient(dense, logits), expected, atol=1e-6)


def test_cross_entropy_takes_bfloat16_logits_and_any_batch_shape(rng):
    """The loss on bfloat16 logits, as mixed_bfloat16 training may give them: float32 losses
    as NumPy computes them from the same bfloat16 values, and a bfloat16 gradient within
    bfloat16 rounding of softmax - t, for two batch shapes in one traced function."""
    eps = 0.1

    @tf.function
    def loss_and_gradient(labels, logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = tf.reduce_sum(kt.losses.smoothed_cross_entropy(labels, logits, eps))
        return kt.losses.smoothed_cross_entropy(labels, logits, eps), tape.gradient(loss, logits)

    for batch, length in [(3, 5), (2, 7)]:
        labels = random_ids(rng, batch, length, 17)
        logits = tf.cast(rng.normal(size=(batch, length, 17)) * 3, tf.bfloat16)
        losses, gradient = loss_and_gradient(tf.constant(labels), logits)
        z = tf.cast(logits, tf.float32).numpy().astype(np.float64)
        expected, _ = numpy_label_smoothing(labels, z, eps, pad_id=-1)
        assert losses.dtype == tf.float32 and gradient.dtype == tf.bfloat16
        np.testing.assert_allclose(losses, expected, rtol=1e-5)
        softmax = np.exp(z - z.max(-1, keepdims=True))
        softmax /= softmax.sum(-1, keepdims=True)
        target = np.full(z.shape, eps / 17)
        np.put_along_axis(target, labels[..., None], 1 - eps + eps / 17, axis=-1)
        np.testing.assert_allclose(tf.cast(gradient, tf.float32), softmax - target,
                                   atol=2e-3, rtol=1e-2)


def test_compiled_loss_converts_bfloat16_bits_as_tf_cast_does(rng):
    """The compiled passes convert between bfloat16 and float32 on the bits (compiled.py says
    why): bit for bit what `tf.cast` gives, eagerly and compiled by XLA, for random bit
    patterns and the edges: ties to even, rounding up into the exponent, the largest finite
    values rounding to infinity, infinities, subnormals and NaN (kept NaN)."""
    edges = [0, 1, 0x8000, 0x7FFF, 0x8001, 0x18000, 0x17FFF, 0x3F808000, 0x3F818000,
             0x3FFFFFFF, 0x007FFFFF, 0x807FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,
             0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF,
             0xFFFFFFFF]
    bits = np.concatenate([rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.array(edges, np.uint32)])
    x = tf.constant(bits.view(np.float32))
    nan = np.isnan(bits.view(np.float32))
    expected = tf.bitcast(tf.cast(x, tf.bfloat16), tf.uint16).numpy()
    xla_rounded = tf.function(compiled.rounded, jit_compile=True)
    for rounded in (compiled.rounded(x, tf.bfloat16), xla_rounded(x, tf.bfloat16)):
        assert rounded.dtype == tf.bfloat16
        np.testing.assert_array_equal(tf.bitcast(rounded, tf.uint16).numpy()[~nan],
                                      expected[~nan])
        assert np.isnan(tf.cast(rounded, tf.float32).numpy()[nan]).all()
    low = tf.bitcast(tf.constant(np.arange(2**16, dtype=np.uint16)), tf.bfloat16)
    cast = tf.cast(low, tf.float32).numpy()
    number = ~np.isnan(cast)
    xla_widened = tf.function(compiled.widened, jit_compile=True)
    for widened in (compiled.widened(low), xla_widened(low)):
        assert widened.dtype == tf.float32
        np.testing.assert_array_equal(widened.numpy()[number], cast[number])
        np.testing.assert_array_equal(np.isnan(widened.numpy()), np.isnan(cast))


def numpy_softmax_minus_target(labels, z, eps):
    """d loss / d logits of §5.4's smoothed cross-entropy: softmax(z) - t."""
    softmax = np.exp(z - z.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    target = np.full(z.shape, eps / z.shape[-1])
    np.put_along_axis(target, labels[..., None], 1 - eps + eps / z.shape[-1], axis=-1)
    return softmax - target


def test_cross_entropy_pads_token_counts_to_few_compiled_shapes(rng):
    """XLA compiles the TensorFlow loss once per shape, so the token count is padded: 51 token
    counts within one power of two compile at most 8 shapes, and every count, small ones too,
    gets NumPy's losses and gradient for exactly its own rows."""
    eps, vocab = 0.1, 13
    forward, backward = kt.losses._cross_entropy_functions()
    traced = forward.experimental_get_tracing_count(), backward.experimental_get_tracing_count()
    for tokens in list(range(257, 512, 5)) + [1, 2, 7, 9, 100]:
        labels = rng.integers(0, vocab, size=(tokens,))
        logits = tf.constant(rng.normal(size=(tokens, vocab)) * 3, tf.float32)
        upstream = rng.uniform(size=(tokens,)).astype(np.float32)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            losses = kt.losses.smoothed_cross_entropy(labels, logits, eps)
            total = tf.reduce_sum(losses * upstream)
        gradient = tape.gradient(total, logits)
        z = logits.numpy().astype(np.float64)
        assert losses.shape == (tokens,) and gradient.shape == (tokens, vocab)
        np.testing.assert_allclose(losses, numpy_label_smoothing(labels, z, eps, pad_id=-1)[0],
                                   rtol=1e-5)
        # float32 rounding of the log-sum-exp, which is summed shifted by the label's logit.
        np.testing.assert_allclose(
            gradient, numpy_softmax_minus_target(labels, z, eps) * upstream[:, None], atol=2e-6)
    # 257..511: at most 8 shapes; 1, 2, 7, 9 and 100: at most 3 more (8, 16, 104 rows).
    assert forward.experimental_get_tracing_count() - traced[0] <= 11
    assert backward.experimental_get_tracing_count() - traced[1] <= 11


def test_cross_entropy_where_a_logit_is_far_above_the_labels(rng):
    """The compiled loss sums exp(logits) shifted by each row's label logit, which overflows
    where another logit is more than about 88 above it; such a batch is summed again shifted
    by the row maxima. Rows 200 above, rows at the edge and ordinary rows: finite losses and
    gradients, as NumPy computes them."""
    eps, vocab, tokens = 0.1, 11, 40
    labels = rng.integers(0, vocab, size=(tokens,))
    z = rng.normal(size=(tokens, vocab)) * 3
    rows = np.arange(tokens)
    z[rows[:5], (labels[:5] + 1) % vocab] = z[rows[:5], labels[:5]] + 200.0
    z[rows[5:10], (labels[5:10] + 1) % vocab] = z[rows[5:10], labels[5:10]] + 87.0
    # All rows (the fallback), then without the first five (the shifted sum alone).
    for first in (0, 5):
        logits, kept_labels = tf.constant(z[first:], tf.float32), labels[first:]
        with tf.GradientTape() as tape:
            tape.watch(logits)
            losses = kt.losses.smoothed_cross_entropy(kept_labels, logits, eps)
            total = tf.reduce_sum(losses)
        gradient = tape.gradient(total, logits)
        expected, _ = numpy_label_smoothing(kept_labels, z[first:], eps, pad_id=-1)
        assert np.isfinite(losses).all() and np.isfinite(gradient).all()
        np.testing.assert_allclose(losses, expected, rtol=1e-5)
        np.testing.assert_allclose(
            gradient, numpy_softmax_minus_target(kept_labels, z[first:], eps), atol=2e-6)


def test_cross_entropy_reads_logits_cast_up_from_bfloat16_as_they_were(rng):
    """Under mixed_bfloat16 the model casts its bfloat16 logits up to float32; in a traced
    step the loss reads the bfloat16 tensor they came from (the same numbers): losses as NumPy
    computes them, and a bfloat16 gradient to that tensor equal, within bfloat16 rounding, to
    what TensorFlow's fused kernel passes back through the cast. The float32 tensor itself
    gets no gradient: the loss does not read it."""
    eps, vocab = 0.1, 17
    labels = random_ids(rng, 3, 6, vocab)
    low = tf.cast(rng.normal(size=(3, 6, vocab)) * 3, tf.bfloat16)
    weights = tf.constant(rng.uniform(size=(3, 6)), tf.float32)

    @tf.function
    def losses_and_gradients(low):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(low)
            logits = tf.cast(low, tf.float32)
            ours = kt.losses.smoothed_cross_entropy(labels, logits, eps)
            target = tf.one_hot(labels, vocab) * (1 - eps) + eps / vocab
            fused = tf.nn.softmax_cross_entropy_with_logits(target, logits)
            ours_total, fused_total = tf.reduce_sum(ours * weights), tf.reduce_sum(fused * weights)
        return (ours, tape.gradient(ours_total, low), tape.gradient(fused_total, low),
                tape.gradient(ours_total, logits) is None)

    ours, gradient, fused_gradient, float32_left_alone = losses_and_gradients(low)
    z = tf.cast(low, tf.float32).numpy().astype(np.float64)
    np.testing.assert_allclose(ours, numpy_label_smoothing(labels, z, eps, pad_id=-1)[0],
                               rtol=1e-5)
    assert gradient.dtype == tf.bfloat16 and bool(float32_left_alone)
    np.testing.assert_allclose(tf.cast(gradient, tf.float32), tf.cast(fused_gradient, tf.float32),
                               atol=1e-3, rtol=1e-2)
    np.testing.assert_allclose(tf.cast(gradient, tf.float32),
                               numpy_softmax_minus_target(labels, z, eps) * weights.numpy()[..., None],
                               atol=2e-3, rtol=1e-2)


def test_without_smoothing_equals_keras_sparse_cross_entropy(rng):
    labels = random_ids(rng, 4, 6, 11)
    logits = rng.normal(size=(4, 6, 11)).astype(np.float32)
    ours = kt.LabelSmoothedCrossEntropy(0.0)(labels, logits)
    keras_tokens = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    np.testing.assert_allclose(ours, np.asarray(keras_tokens)[labels != 0].mean(), rtol=1e-5)


def test_masked_token_accuracy_counts_real_tokens_only():
    metric = kt.MaskedTokenAccuracy()
    labels = np.array([[3, 4, 0], [5, 0, 0]])
    logits = np.zeros((2, 3, 6), np.float32)
    logits[0, 0, 3] = logits[0, 1, 5] = logits[1, 0, 5] = 1  # 2 of 3 real tokens right
    metric.update_state(labels, logits)
    assert float(metric.result()) == np.float32(2 / 3)


def loss_and_gradients(strategy, weights, inputs, labels):
    """Loss and gradients of one global batch, computed the way `model.fit` does."""
    with strategy.scope():
        model = kt.Transformer(small_config())
        model.build()
        model.set_weights(weights)
        loss_fn = kt.LabelSmoothedCrossEntropy(0.1)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=False))
        return loss, tape.gradient(loss, model.trainable_variables)

    dataset = tf.data.Dataset.from_tensors((inputs, labels))
    x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))
    loss, grads = strategy.run(tf.function(step), args=(x, y))
    reduce = lambda v: strategy.reduce("SUM", v, axis=None)  # noqa: E731
    return reduce(loss).numpy(), [reduce(g).numpy() for g in grads]


def test_mirrored_loss_and_gradients_equal_single_device(rng, two_cpu_replicas):
    model = kt.Transformer(small_config())
    model.build()
    weights = model.get_weights()
    # Uneven lengths: the two replicas hold different numbers of real target tokens.
    inputs = {"source_ids": random_ids(rng, 4, 6, 50), "target_ids": random_ids(rng, 4, 5, 50)}
    inputs["target_ids"][:2, 1:] = 0
    labels = np.roll(inputs["target_ids"], -1, axis=1)
    mirrored = two_cpu_replicas
    assert mirrored.num_replicas_in_sync == 2
    single_loss, single_grads = loss_and_gradients(tf.distribute.get_strategy(), weights,
                                                   inputs, labels)
    loss, grads = loss_and_gradients(mirrored, weights, inputs, labels)
    np.testing.assert_allclose(loss, single_loss, rtol=1e-5)
    for g, ref in zip(grads, single_grads):
        np.testing.assert_allclose(g, ref, atol=1e-6, rtol=1e-4)


def test_perplexity_is_exp_of_the_token_mean_nll(rng):
    """Perplexity over two batches = exp(mean -log p(label)) over their real tokens, by NumPy;
    the label smoothing of the loss plays no part."""
    metric = kt.Perplexity(pad_id=0)
    nll = []
    for _ in range(2):
        logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
        labels = rng.integers(1, 11, size=(3, 5))
        labels[0, 3:] = 0
        log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
        nll.extend(-picked[labels != 0])
        metric.update_state(tf.constant(labels), tf.constant(logits))
    np.testing.assert_allclose(float(metric.result()), np.exp(np.mean(nll)), rtol=1e-5)
    metric.reset_state()
    assert float(metric.result()) == 1.0  # exp(0): nothing seen
