"""The benchmark's peer is a fair one: the same dimensions, and its decoding runs."""

import keras_hub
import numpy as np
import tensorflow as tf
from conftest import small_config

import keras_transformer as kt
from benchmarks.peer import PeerTransformer, peer_generate


def test_peer_has_our_dimensions():
    config = small_config(vocab_size=120)
    ours, peer = kt.Transformer(config), PeerTransformer(config)
    ids = tf.constant([[5, 6, 7]])
    ours_logits = ours({"source_ids": ids, "target_ids": ids})
    peer_logits = peer({"source_ids": ids, "target_ids": ids})
    assert ours_logits.shape == peer_logits.shape == (1, 3, 120)
    assert ours.count_params() == peer.count_params()


def test_peer_generates_fixed_length():
    config = small_config(vocab_size=60)
    peer = PeerTransformer(config)
    source = tf.constant(np.random.default_rng(0).integers(3, 60, (3, 5)), tf.int32)
    peer({"source_ids": source, "target_ids": source})
    for sampler in (keras_hub.samplers.GreedySampler(), keras_hub.samplers.BeamSampler(2)):
        out = peer_generate(peer, source, 4, sampler).numpy()
        assert out.shape == (3, 5) and np.all(out[:, 0] == 1) and np.all(out[:, 1:] > 0)


def test_training_flops_follow_the_printed_formula():
    # The per-token formula the benchmark prints, against its list of matrix products.
    from benchmarks.training import step_flops

    config = kt.TransformerConfig.preset("tiny", vocab_size=500)
    d, f, layers, vocab = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    batch, source, target = 3, 7, 5
    per_source = layers * (12 * d * d + 4 * d * f + 4 * source * d)
    per_target = layers * (12 * d * d + 4 * d * f + 4 * target * d + 4 * source * d) + 2 * d * vocab
    expected = 3 * batch * (source * per_source + target * per_target)
    assert step_flops(config, batch, source, target) == expected


def test_bfloat16_logits_product_matches_numpy():
    """benchmarks.logits_precision's other way: float32 logits of a bfloat16 product, within
    bfloat16's rounding of the NumPy product."""
    import keras
    import numpy as np

    from benchmarks.logits_precision import bfloat16_logits
    from keras_transformer.embedding import SharedEmbedding

    layer = SharedEmbedding(50, 16, dtype="mixed_bfloat16")
    layer.build()
    x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype("float32")
    logits = bfloat16_logits(layer, keras.ops.cast(x, "bfloat16"))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    expected = x @ keras.ops.convert_to_numpy(layer.embeddings).T
    scale = np.abs(x) @ np.abs(keras.ops.convert_to_numpy(layer.embeddings)).T
    error = np.abs(keras.ops.convert_to_numpy(logits) - expected)
    assert logits.shape == (2, 3, 50) and np.all(error <= 3 * 2.0**-8 * scale + 1e-6)
    assert np.any(error > 1e-6)  # the product really was rounded to bfloat16
