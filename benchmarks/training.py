"""Training throughput: this project's `Transformer` against the keras-hub peer of the same
dimensions (benchmarks/peer.py), on the same synthetic batches, alternated in one process.

    python -m benchmarks.training [--presets tiny,base] [--precisions float32,mixed_bfloat16]
        [--xla off,on] [--steps 10] [--repeats 3] [--out benchmarks/results/training.json]

Reported per variant: median step time over the repeats (warm-up steps excluded), target
tokens per second, the ratio ours/peer, MFU against a `tf.matmul` peak measured in the same
run (2048 x 2048, float32 and bfloat16), and the matmul floor: the time of exactly the step's
matrix products (every forward product and its two backward ones, same shapes and dtype) run
alone, back to back in one graph. No implementation that does these products can step faster
than the floor, so peer step / floor bounds the ratio any of them can reach against the peer.
FLOPs per step = 3 x forward matmul FLOPs (forward plus a backward pass twice as costly),
embeddings, norms and softmax excluded:

    per source token:  L * (12 d^2 + 4 d d_ff + 4 S d)     (incl. the memory's K, V projections)
    per target token:  L * (12 d^2 + 4 d d_ff + 4 T d + 4 S d) + 2 d V
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
    a = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
    fn = tf.function(tf.matmul, jit_compile=jit)
    # Warm-up: tracing, oneDNN kernel selection.
    return 2 * n**3 / time_best(lambda: fn(a, a).numpy(), repeats, warmup=3) / 1e9


def step_matmuls(config, batch, source_length, target_length):
    """The forward matrix products of one training step, as (batch dims, m, k, n)."""
    d, f, vocab = config.d_model, config.d_ff, config.vocab_size
    heads, kv_heads = config.num_heads, config.num_kv_heads or config.num_heads
    d_k = config.key_dim or d // heads
    src, tgt = batch * source_length, batch * target_length

    def attention(queries, keys, query_rows, key_rows):  # Q, O; K, V; the two products
        return ([(1, query_rows, d, heads * d_k), (1, query_rows, heads * d_k, d)]
                + [(1, key_rows, d, kv_heads * d_k)] * 2
                + [(batch * heads, queries, d_k, keys), (batch * heads, queries, keys, d_k)])

    encoder = attention(source_length, source_length, src, src) + [(1, src, d, f), (1, src, f, d)]
    decoder = (attention(target_length, target_length, tgt, tgt)
               + attention(target_length, source_length, tgt, src)
               + [(1, tgt, d, f), (1, tgt, f, d)])
    return config.num_layers * (encoder + decoder) + [(1, tgt, d, vocab)]


def step_flops(config, batch, source_length, target_length):
    return 3 * sum(2 * b * m * k * n
                   for b, m, k, n in step_matmuls(config, batch, source_length, target_length))


def matmul_floor(config, batch, source_length, target_length, dtype, repeats=5):
    """Seconds for the step's matrix products alone: each forward product C = A B and its
    backward products dC B^T and A^T dC, in `dtype`, in one graph (independent products may
    run concurrently, as in training)."""
    operands = []
    for b, m, k, n in step_matmuls(config, batch, source_length, target_length):
        lead = [b] if b > 1 else []
        operands.append([tf.cast(tf.random.normal(lead + shape), dtype)
                         for shape in ([m, k], [k, n], [m, n])])

    @tf.function
    def products():
        out = []
        for a, w, grad in operands:
            out += [tf.matmul(a, w), tf.matmul(grad, w, transpose_b=True),
                    tf.matmul(a, grad, transpose_a=True)]
        return [tf.reduce_sum(x[..., :1, :1]) for x in out]  # keep all, copy nothing

    return time_best(lambda: [x.numpy() for x in products()], repeats)


def time_best(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def make_batch(config, batch, source_length, target_length, seed=0):
    rng = np.random.default_rng(seed)
    ids = lambda length: rng.integers(3, config.vocab_size, (batch, length)).astype(np.int32)  # noqa: E731
    return {"source_ids": ids(source_length), "target_ids": ids(target_length)}, ids(target_length)


def build(kind, config, precision, jit, x):
    """Ours with this library's optimizer; the peer with the stock Keras Adam of the same
    settings, as its user would. Both get our loss: Keras has no label-smoothed cross-entropy
    on sparse labels (its dense one would cost the peer a one-hot [B, T, V] target)."""
    keras.mixed_precision.set_global_policy(precision)
    if kind == "ours":
        model, optimizer = kt.Transformer(config), kt.make_optimizer(1e-4)
    else:
        model = PeerTransformer(config)
        optimizer = keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    model(x)
    model.compile(optimizer=optimizer,
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing),
                  jit_compile=jit)
    keras.mixed_precision.set_global_policy("float32")
    return model


class StepTimer(keras.callbacks.Callback):
    """Wall time of each training step, the loss read back so the step has finished. (With no
    callback of this kind, Keras dispatches batch ends to a thread pool; on a 2-core machine
    that was seen to stretch steps to whole seconds, for both models alike.)"""

    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        self.times.append(time.perf_counter() - self.start)


def time_steps(model, dataset, steps):
    """The mean step time over `steps` steps."""
    timer = StepTimer()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
    return statistics.mean(timer.times)


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
        floors = {}
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
                if precision not in floors:
                    floors[precision] = matmul_floor(
                        config, batch, source_length, target_length,
                        tf.float32 if precision == "float32" else tf.bfloat16)
                result = {"preset": preset, "precision": precision, "xla": jit,
                          "matmul_floor_s": floors[precision]}
                for kind in models:
                    seconds = statistics.median(times[kind])
                    result[kind] = {"step_s": seconds,
                                    "target_tokens_per_s": batch * target_length / seconds,
                                    "mfu": flops / seconds / 1e9 / peak}
                result["ratio"] = result["peer"]["step_s"] / result["ours"]["step_s"]
                result["ratio_bound"] = result["peer"]["step_s"] / floors[precision]
                rows.append(result)
                print(markdown_row(result), flush=True)
                del models
    return {"matmul_peak_gflops": peaks, "flops_formula": FLOP_FORMULA, "rows": rows,
            "batch": [batch, source_length, target_length]}


def markdown_row(r):
    return (f"| {r['preset']} | {r['precision']} | {'on' if r['xla'] else 'off'} "
            f"| {r['ours']['target_tokens_per_s']:,.0f} | {r['peer']['target_tokens_per_s']:,.0f} "
            f"| {r['ratio']:.2f}x | {r['ours']['mfu']:.2f} | {r['peer']['mfu']:.2f} "
            f"| {r['matmul_floor_s']:.3f} | {r['ours']['step_s']:.3f} | {r['peer']['step_s']:.3f} "
            f"| {r['ratio_bound']:.2f}x |")


def markdown(report):
    peaks = report["matmul_peak_gflops"]
    lines = [f"matmul peak (2048^2): float32 {peaks['float32']:.0f} GFLOP/s, bfloat16 "
             f"{peaks['bfloat16']:.0f} (XLA {peaks['bfloat16_xla']:.0f}); FLOPs per step = "
             f"{report['flops_formula']}", "",
             "| preset | precision | XLA | ours tokens/s | keras-hub tokens/s | ours/peer "
             "| MFU ours | MFU peer | matmul floor s | ours s/step | peer s/step "
             "| peer/floor (best ratio possible) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
