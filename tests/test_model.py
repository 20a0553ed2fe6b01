import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids, small_config

import keras_transformer as kt


def make_model(dtype=None, **overrides):
    model = kt.Transformer(small_config(**overrides), dtype=dtype)
    model.build()
    return model


def batch(rng, b=3, s=7, t=6, vocab=50):
    return {"source_ids": tf.constant(random_ids(rng, b, s, vocab)),
            "target_ids": tf.constant(random_ids(rng, b, t, vocab))}


@pytest.mark.parametrize("name, count", [("base", 63_082_496), ("big", 214_245_376)])
def test_parameter_counts_match_the_paper(name, count):
    model = kt.Transformer(kt.TransformerConfig.preset(name, vocab_size=37_000))
    model.build()
    assert model.count_params() == count


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"num_kv_heads": 2},
                                       {"position": "learned"}])
def test_causality(rng, overrides):
    model = make_model(**overrides)
    source = tf.constant(random_ids(rng, 2, 6, 50, min_length=6))
    target = random_ids(rng, 2, 8, 50, min_length=8)
    logits = model({"source_ids": source, "target_ids": tf.constant(target)})
    for j in (0, 3, 7):
        changed = target.copy()
        changed[:, j] = (changed[:, j] + 1 - 3) % 47 + 3
        other = model({"source_ids": source, "target_ids": tf.constant(changed)})
        np.testing.assert_allclose(other[:, :j], logits[:, :j], atol=1e-5)
        assert not np.allclose(other[:, j], logits[:, j])


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"position": "learned"}])
def test_padding_does_not_change_real_positions(rng, overrides):
    model = make_model(**overrides)
    source = random_ids(rng, 3, 5, 50, min_length=2)
    target = random_ids(rng, 3, 4, 50, min_length=2)
    logits = model({"source_ids": tf.constant(source), "target_ids": tf.constant(target)})
    padded = model({"source_ids": tf.constant(np.pad(source, ((0, 0), (0, 6)))),
                    "target_ids": tf.constant(np.pad(target, ((0, 0), (0, 3))))})
    real = target != 0
    np.testing.assert_allclose(padded.numpy()[:, :4][real], logits.numpy()[real], atol=1e-4)


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"position": "learned"}])
def test_a_row_of_several_pairs_computes_each_as_if_alone(rng, overrides):
    """Rows that concatenate pairs (`make_dataset(batching="concat")`): with their segment ids
    and positions, each pair's logits equal that pair's logits computed alone, unpadded (the
    independent path: the plain model call on one pair)."""
    model = make_model(**overrides)
    pairs = [(random_ids(rng, 1, n, 50, min_length=n)[0],
              random_ids(rng, 1, m, 50, min_length=m)[0]) for n, m in ((4, 3), (2, 5), (6, 1))]
    row = {name: [] for name in ("source_ids", "target_ids", "source_segment_ids",
                                 "target_segment_ids", "source_positions", "target_positions")}
    for segment, (source, target) in enumerate(pairs, start=1):
        for side, ids in (("source", source), ("target", target)):
            row[f"{side}_ids"] += list(ids)
            row[f"{side}_segment_ids"] += [segment] * len(ids)
            row[f"{side}_positions"] += list(range(len(ids)))
    for name, values in row.items():  # padding at the end of the row
        row[name] = tf.constant([values + [0, 0]])
    logits = model(row).numpy()[0]
    start = 0
    for source, target in pairs:
        alone = model({"source_ids": tf.constant([source]), "target_ids": tf.constant([target])})
        np.testing.assert_allclose(logits[start:start + len(target)], alone[0], atol=1e-4)
        start += len(target)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_logits_are_float32(rng, policy):
    keras.mixed_precision.set_global_policy(policy)
    model = make_model()
    logits = model(batch(rng))
    assert logits.dtype == tf.float32
    assert np.all(np.isfinite(logits))
    assert model.embedding.embeddings.dtype == "float32"


def test_keras_file_round_trip(rng, tmp_path):
    model = make_model(norm_first=True, position="learned")
    inputs = batch(rng)
    expected = model(inputs)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.config == model.config
    np.testing.assert_allclose(loaded(inputs), expected, atol=1e-6)


def test_weights_files_of_the_layout_before_0_2_still_load(rng, tmp_path):
    """Before 0.2 each sub-layer's norm and dropout lived in a `Residual` layer; such files
    (here rebuilt from today's by moving the groups to the old names) load with the same
    weights, and a file of another shape is refused by name."""
    import h5py

    from keras_transformer import ConfigError, run_dir

    model = make_model(norm_first=True)
    inputs = batch(rng)
    expected = model(inputs)
    current = tmp_path / "current.weights.h5"
    model.save_weights(current)
    old_names = {"encoder": {"self_attention": "attention_residual",
                             "feed_forward": "feed_forward_residual"},
                 "decoder": {"self_attention": "self_attention_residual",
                             "cross_attention": "cross_attention_residual",
                             "feed_forward": "feed_forward_residual"}}
    old = tmp_path / "old.weights.h5"
    with h5py.File(current) as source, h5py.File(old, "w") as target:
        target.attrs.update(source.attrs)
        for key in source:
            source.copy(source[key], target, key)
        for stack, renames in old_names.items():
            for layer in target[f"{stack}/layers"].values():
                for sublayer, old_name in renames.items():
                    layer.move(f"{sublayer}_norm", f"{old_name}/norm")
                    layer.move(f"{sublayer}_dropout", f"{old_name}/drop_output")
    with h5py.File(old) as f:
        assert "attention_residual/norm" in f["encoder/layers/encoder_layer"]
    fresh = make_model(norm_first=True)
    run_dir.load_weights(fresh, old)
    np.testing.assert_allclose(fresh(inputs), expected, atol=1e-6)
    with pytest.raises(ConfigError, match="does not fit this model's layers"):
        run_dir.load_weights(make_model(norm_first=True, d_model=16), current)


def test_every_layer_config_round_trips():
    layers = [
        kt.MultiHeadAttention(4, key_dim=8, num_kv_heads=2, dropout=0.1),
        kt.PositionalEncoding(max_wavelength=500.0), kt.LearnedPositionEmbedding(12),
        kt.SharedEmbedding(30, 16), kt.FeedForward(64),
        kt.EncoderLayer(4, 64, norm_first=True), kt.DecoderLayer(4, 64, num_kv_heads=1),
        kt.Encoder(2, 4, 64, position="learned"), kt.Decoder(2, 4, 64, dropout=0.3),
    ]
    for layer in layers:
        config = layer.get_config()
        assert type(layer).from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(
        kt.LabelSmoothedCrossEntropy(0.2, pad_id=1)))
    assert (restored.label_smoothing, restored.pad_id) == (0.2, 1)


def test_train_step_compiles_with_xla(rng):
    model = make_model()
    model.compile(optimizer=kt.make_optimizer(1e-3), loss=kt.LabelSmoothedCrossEntropy(),
                  metrics=[kt.MaskedTokenAccuracy()], jit_compile=True)
    inputs = batch(rng, b=4)
    labels = np.roll(inputs["target_ids"].numpy(), -1, axis=1)
    history = model.fit(inputs, labels, epochs=3, verbose=0)
    assert model.jit_compile
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("global_policy", [False, True])
def test_bfloat16_both_ways_train_infer_and_decode(rng, global_policy):
    """Issue 14: a model asked for bfloat16 through its own `dtype` works as one built under
    the global policy: every sublayer (dropout included) computes in bfloat16, in training,
    inference and decoding."""
    if global_policy:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = kt.Transformer(small_config(dropout=0.1))
    else:
        model = kt.Transformer(small_config(dropout=0.1), dtype="mixed_bfloat16")
    model.build()
    inputs = batch(rng)
    assert model({**inputs}, training=True).dtype == tf.float32
    assert model(inputs, training=False).dtype == tf.float32
    assert {layer.compute_dtype for layer in model._flatten_layers()} == {"bfloat16"}
    result = kt.greedy_search(model, inputs["source_ids"], bos_id=1, eos_id=2, max_extra=3)
    assert result is not None


def test_logits_under_mixed_precision_both_products(rng):
    """Issue 22, item 1: under mixed_bfloat16 the training logits are a bfloat16 product (the
    table cast down) returned in float32, within bfloat16's rounding of a NumPy float32
    product and really rounded; with `float32_product=True` (the decoding steps, issue 14)
    they equal the NumPy float32 product of the (bfloat16) decoder output with the table."""
    model = kt.Transformer(small_config(), dtype="mixed_bfloat16")
    model.build()
    x = tf.cast(tf.random.stateless_normal([2, 3, 32], [1, 2]), tf.bfloat16)
    table = model.embedding.embeddings.numpy()
    expected = x.numpy().astype(np.float32) @ table.T

    full = model.embedding.logits(x, float32_product=True)
    assert full.dtype == tf.float32
    np.testing.assert_allclose(full.numpy(), expected, rtol=1e-5, atol=1e-5)
    rounded = tf.cast(tf.cast(expected, tf.bfloat16), tf.float32).numpy()
    assert not np.allclose(full.numpy(), rounded, rtol=1e-6, atol=0)

    logits = model.embedding.logits(x)
    assert logits.dtype == tf.float32
    scale = np.abs(x.numpy().astype(np.float32)) @ np.abs(table).T
    error = np.abs(logits.numpy() - expected)
    # The table's rounding to bfloat16 and the result's: a few units of 2^-8 of |x| |W|^T.
    assert np.all(error <= 3 * 2.0**-8 * scale + 1e-6)
    assert np.any(error > 1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_logits_gradients_match_numpy(rng, policy):
    """The training logits' gradients (on TensorFlow a custom gradient whose two products run
    one after the other, `embedding.product_with_table`), traced as in training, against
    NumPy: d x = upstream W and d W = upstream^T x, where the forward product is x W^T (in
    the compute dtype, so within bfloat16's rounding under mixed_bfloat16)."""
    layer = kt.SharedEmbedding(40, 16, dtype=policy)
    layer.build()
    x = tf.constant(rng.normal(size=(2, 5, 16)), tf.float32)
    upstream = tf.constant(rng.normal(size=(2, 5, 40)), tf.float32)

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer.logits(tf.cast(x, layer.compute_dtype)) * upstream)
        return tape.gradient(loss, [x, layer.embeddings])

    d_x, d_table = (g.numpy() for g in gradients())
    table, flat_x, flat_up = (layer.embeddings.numpy(), x.numpy().reshape(-1, 16),
                              upstream.numpy().reshape(-1, 40))
    tolerance = 1e-5 if policy == "float32" else 0.02
    np.testing.assert_allclose(d_x.reshape(-1, 16), flat_up @ table,
                               atol=tolerance * np.abs(flat_up @ table).max())
    np.testing.assert_allclose(d_table, flat_up.T @ flat_x,
                               atol=tolerance * np.abs(flat_up.T @ flat_x).max())


@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_gradient_accumulation_weights_every_token_equally(rng, precision):
    """Issue 14: an update accumulated over a short and a long micro-batch equals one update
    on both together (the loss is the mean over the update's real tokens). Adam with a huge
    epsilon makes the first update proportional to the gradient, so a different weighting
    of the micro-batches would show; Keras' plain averaging of the micro-batch means is
    checked to differ, so the comparison can fail. Under mixed_float16 (issue 23, item 8)
    the model is compiled with loss scaling, which Keras' own LossScaleOptimizer applied
    without the token weighting; float16 rounding gets a looser tolerance, and a larger rate
    keeps the updates well above the float32 rounding of the weights."""
    rate = 1e-2 if precision == "float32" else 10.0
    short = {"source_ids": random_ids(rng, 2, 3, 50, 3), "target_ids": random_ids(rng, 2, 2, 50, 2)}
    long = {"source_ids": random_ids(rng, 6, 9, 50, 9), "target_ids": random_ids(rng, 6, 8, 50, 8)}
    labels = [np.roll(b["target_ids"], -1, axis=1) for b in (short, long)]
    both = {k: np.concatenate([np.pad(short[k], ((0, 0), (0, long[k].shape[1] - short[k].shape[1]))),
                               long[k]]) for k in short}
    both_labels = np.concatenate([np.pad(labels[0], ((0, 0), (0, 6))), labels[1]])

    def one_update(optimizer, batches):
        keras.utils.set_random_seed(1)
        model = make_model(dtype=precision)
        # eager: three models, each traced for two shapes, would take over a minute to trace
        model.compile(optimizer=optimizer, loss=kt.LabelSmoothedCrossEntropy(), run_eagerly=True)
        if precision == "mixed_float16":
            assert isinstance(model.optimizer, kt.TokenWeightedLossScaleOptimizer)
        data = tf.data.Dataset.from_generator(
            lambda: iter(batches), output_signature=(
                {"source_ids": tf.TensorSpec([None, None], tf.int32),
                 "target_ids": tf.TensorSpec([None, None], tf.int32)},
                tf.TensorSpec([None, None], tf.int32)))
        start = [w.numpy() for w in model.trainable_weights]
        model.fit(data, epochs=1, steps_per_epoch=len(batches), verbose=0)
        return [w.numpy() - s for w, s in zip(model.trainable_weights, start)]

    big = one_update(kt.make_optimizer(rate, epsilon=1e3), [(both, both_labels)])
    accumulated = one_update(kt.make_optimizer(rate, epsilon=1e3, gradient_accumulation_steps=2),
                             [(short, labels[0]), (long, labels[1])])
    averaged = one_update(keras.optimizers.Adam(rate, beta_1=0.9, beta_2=0.98, epsilon=1e3,
                                                gradient_accumulation_steps=2),
                          [(short, labels[0]), (long, labels[1])])
    def relative_error(update):
        return (max(np.abs(u - b).max() for u, b in zip(update, big))
                / max(np.abs(b).max() for b in big))

    if precision == "float32":
        for b, a in zip(big, accumulated):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-9)
    else:
        assert relative_error(accumulated) < 0.005
    assert relative_error(averaged) > 0.05


def test_evaluation_only_metrics_skip_training_steps(rng):
    """Issue 22: a metric made with `in_training=False` is left alone by `fit`'s steps and out
    of their logs, while one made with True is there; `evaluate` reports it, equal to a NumPy
    perplexity of the model's own logits."""
    model = kt.Transformer(small_config(dropout=0.0))
    inputs = {"source_ids": random_ids(rng, 4, 6, 50), "target_ids": random_ids(rng, 4, 5, 50)}
    labels = np.roll(inputs["target_ids"], -1, axis=1)
    model.compile(optimizer="adam", loss=kt.LabelSmoothedCrossEntropy(0.1),
                  metrics=[kt.Perplexity(in_training=False), kt.MaskedTokenAccuracy()])
    history = model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0).history
    assert "token_accuracy" in history and "perplexity" not in history
    perplexity = model._compile_metrics.metrics[0]
    assert float(perplexity.count.numpy()) == 0.0  # never updated by a training step

    result = model.evaluate(inputs, labels, batch_size=4, verbose=0, return_dict=True)
    logits = model(inputs).numpy().astype(np.float64)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0][labels != 0]
    np.testing.assert_allclose(result["perplexity"], np.exp(nll.mean()), rtol=1e-4)
    assert kt.Perplexity.from_config(perplexity.get_config()).in_training is False
