import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids, small_config

import keras_transformer as kt


def make_model(**overrides):
    model = kt.Transformer(small_config(**overrides))
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
