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


def test_step_profile_wall_clock_against_a_brute_force_timeline(tmp_path):
    # Op events on two threads, laid on a time line by the benchmark and by sampling every
    # picosecond here.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.step_profile import wall_clock

    ops = {1: "StatefulPartitionedCall/gradient_tape/dense/MatMul:_MklMatMul",
           2: "StatefulPartitionedCall/transformer/dropout/mul:Mul",
           3: "CpuExecutable::ExecuteAsyncOnStream",
           4: "StatefulPartitionedCall/transformer/add:AddV2"}
    threads = [[(1, 0, 10), (3, 22, 30)], [(2, 5, 15), (4, 26, 34), (1, 40, 44)]]
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for metadata_id, name in ops.items():
        plane.event_metadata[metadata_id].name = name
    for events in threads:
        line = plane.lines.add(timestamp_ns=0)
        for metadata_id, start, end in events:
            line.events.add(metadata_id=metadata_id, offset_ps=start, duration_ps=end - start)
    (tmp_path / "host.xplane.pb").write_bytes(space.SerializeToString())

    spans, others = wall_clock(str(tmp_path))
    expected = {"matmul running": 0, "other ops only": 0, "nothing running": 0}
    shares = {}
    for tick in range(44):
        running = [ops[i].rsplit(":", 1)[-1] for thread in threads for i, start, end in thread
                   if start <= tick < end]
        kind = ("nothing running" if not running else "matmul running"
                if any("MatMul" in name for name in running) else "other ops only")
        expected[kind] += 1
        if kind == "other ops only":
            for name in running:
                shares[name] = shares.get(name, 0) + 1 / len(running)
    assert {k: round(v * 1e12) for k, v in spans.items()} == {
        k: v for k, v in expected.items() if v}
    assert {kind: round(v * 1e12, 6) for (kind, _), v in others.items()} == {
        ("XLA program" if k == "ExecuteAsyncOnStream" else k): round(v, 6)
        for k, v in shares.items()}
