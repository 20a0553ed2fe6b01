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
