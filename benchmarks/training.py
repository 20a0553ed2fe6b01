"""Training throughput: this project's `Transformer` against the keras-hub peer of the same
dimensions (benchmarks/peer.py), on the same synthetic batches, alternated in one process.

    python -m benchmarks.training [--presets tiny,base] [--precisions float32,mixed_bfloat16]
        [--xla off,on] [--steps 10] [--repeats 3] [--out benchmarks/results/training.json]

Reported per variant: median step time over the repeats (warm-up steps excluded), target
tokens per second, the ratio ours/peer, and MFU against a `tf.matmul` peak measured in the same
run (2048 x 2048, float32 and bfloat16). FLOPs per step = 3 x forward matmul FLOPs (forward
plus a backward pass twice as costly), embeddings, norms and softmax excluded:

    per source token:  L * (8 d^2 + 4 d d_ff + 4 S d)
    per target token:  L * (16 d^2 + 4 d d_ff + 4 T d + 4 S d) + 2 d V
"""

import argparse
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import keras_transformer as kt
from benchmarks import save
from benchmarks.peer import PeerTransformer

FLOP_FORMULA = "3 x forward matmul FLOPs; " + " ".join(
    __doc__.split("embeddings, norms and softmax excluded:")[1].split())


def matmul_peak(dtype, n=2048, repeats=10, jit=False):
    a = tf.random.normal((n, n), dtype=tf.float32)
    a = tf.cast(a, dtype)
    fn = tf.function(tf.matmul, jit_compile=jit)
    for _ in range(3):  # warm-up: tracing, oneDNN kernel selection
        fn(a, a).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(a, a).numpy()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def step_flops(config, batch, source_length, target_length):
    d, f, layers, vocab = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    source = layers * (8 * d * d + 4 * d * f + 4 * source_length * d)
    target = layers * (16 * d * d + 4 * d * f + 4 * target_length * d
                       + 4 * source_length * d) + 2 * d * vocab
    return 3 * batch * (source_length * source + target_length * target)


def make_batch(config, batch, source_length, target_length, seed=0):
    rng = np.random.default_rng(seed)
    ids = lambda length: rng.integers(3, config.vocab_size, (batch, length)).astype(np.int32)  # noqa: E731
    return {"source_ids": ids(source_length), "target_ids": ids(target_length)}, ids(target_length)


def build(kind, config, precision, jit, x):
    keras.mixed_precision.set_global_policy(precision)
    model = kt.Transformer(config) if kind == "ours" else PeerTransformer(config)
    model(x)
    model.compile(optimizer=kt.make_optimizer(1e-4),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing),
                  jit_compile=jit)
    keras.mixed_precision.set_global_policy("float32")
    return model


def time_steps(model, dataset, steps):
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps


def run(presets=("tiny", "base"), precisions=("float32", "mixed_bfloat16"), xla=(False, True),
        batch=64, source_length=32, target_length=32, steps=10, repeats=3, warmup=3):
    peaks = {"float32": matmul_peak(tf.float32), "bfloat16": matmul_peak(tf.bfloat16),
             "bfloat16_xla": matmul_peak(tf.bfloat16, jit=True)}
    rows = []
    for preset in presets:
        vocab = 8000 if preset == "tiny" else 32000
        config = kt.TransformerConfig.preset(preset, vocab_size=vocab)
        x, y = make_batch(config, batch, source_length, target_length)
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
        flops = step_flops(config, batch, source_length, target_length)
        for precision in precisions:
            for jit in xla:
                models = {kind: build(kind, config, precision, jit, x) for kind in ("ours", "peer")}
                for model in models.values():
                    time_steps(model, dataset, warmup)
                times = {kind: [] for kind in models}
                for _ in range(repeats):  # alternate, so drift hits both alike
                    for kind, model in models.items():
                        times[kind].append(time_steps(model, dataset, steps))
                peak = peaks["float32" if precision == "float32" else
                             "bfloat16_xla" if jit else "bfloat16"]
                result = {"preset": preset, "precision": precision, "xla": jit}
                for kind in models:
                    seconds = statistics.median(times[kind])
                    result[kind] = {"step_s": seconds,
                                    "target_tokens_per_s": batch * target_length / seconds,
                                    "mfu": flops / seconds / 1e9 / peak}
                result["ratio"] = result["peer"]["step_s"] / result["ours"]["step_s"]
                rows.append(result)
                print(markdown_row(result), flush=True)
                del models
    return {"matmul_peak_gflops": peaks, "flops_formula": FLOP_FORMULA, "rows": rows,
            "batch": [batch, source_length, target_length]}


def markdown_row(r):
    return (f"| {r['preset']} | {r['precision']} | {'on' if r['xla'] else 'off'} "
            f"| {r['ours']['target_tokens_per_s']:,.0f} | {r['peer']['target_tokens_per_s']:,.0f} "
            f"| {r['ratio']:.2f}x | {r['ours']['mfu']:.2f} | {r['peer']['mfu']:.2f} |")


def markdown(report):
    peaks = report["matmul_peak_gflops"]
    lines = [f"matmul peak (2048^2): float32 {peaks['float32']:.0f} GFLOP/s, bfloat16 "
             f"{peaks['bfloat16']:.0f} (XLA {peaks['bfloat16_xla']:.0f}); FLOPs per step = "
             f"{report['flops_formula']}", "",
             "| preset | precision | XLA | ours tokens/s | keras-hub tokens/s | ours/peer | MFU ours | MFU peer |",
             "|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [markdown_row(r) for r in report["rows"]])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument("--xla", default="off,on")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/training.json")
    args = parser.parse_args()
    report = run(args.presets.split(","), args.precisions.split(","),
                 [v == "on" for v in args.xla.split(",")], steps=args.steps,
                 repeats=args.repeats)
    save(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
