"""What building oneDNN's products for new shapes costs the trainer's step: the trainer's own
model on a run of its own news batches (each a new batch, as in training), with oneDNN's
verbose log on, its products built afresh ("create:cache_miss") counted and timed step by
step. Packed batches change shape at nearly every step, and oneDNN builds a product (a
"primitive") for each shape it has not kept; the time is spent inside the step.

    python -m benchmarks.product_shapes [--precision mixed_bfloat16] [--steps 150]
        [--capacity N] [--tree DIR] [--out benchmarks/results/product_shapes_<precision>.json]

`--capacity` sets ONEDNN_PRIMITIVE_CACHE_CAPACITY for the run (keras_transformer raises it to
4,096; oneDNN's own default is 1,024). `--tree` runs the model of another source tree (`git
worktree add`) to compare. The verbose log slows the step; the step times printed beside the
counts are for orientation only.
"""

import argparse
import collections
import os
import pathlib
import statistics
import subprocess
import sys

from benchmarks.end_to_end import NEWS_DIR, describe_hardware, hardware
from benchmarks.quick_start import commit

# The child: the trainer's model (benchmarks.step_profile.trainer_setup) trained on `steps`
# consecutive batches of its own pipeline, a mark printed before each step and its time after.
CHILD = """
import sys, time
import keras, tensorflow as tf
from benchmarks.step_profile import corpus_flags, trainer_setup
precision, steps, news_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
_, _, model, batches = trainer_setup(corpus_flags("news", news_dir, precision))
fixed = list(batches.take(steps).as_numpy_iterator())
dataset = tf.data.Dataset.from_generator(lambda: iter(fixed),
                                         output_signature=batches.element_spec)

class Marks(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()
        print("STEP", batch, flush=True)

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        print("TIME", time.perf_counter() - self.start, flush=True)

model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Marks()])
"""


def creations(lines):
    """{step: [(primitive kind, milliseconds)]} of the products built afresh, and {step:
    seconds}, from the child's output."""
    built, times, step = collections.defaultdict(list), {}, None
    for line in lines:
        if line.startswith("STEP "):
            step = int(line.split()[1])
        elif line.startswith("TIME ") and step is not None:
            times[step] = float(line.split()[1])
        elif step is not None and line.startswith("onednn_verbose"):
            fields = line.strip().split(",")
            if len(fields) > 6 and fields[3] == "create:cache_miss":
                built[step].append((fields[5], float(fields[-1])))
    return built, times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--window", type=int, default=25, help="steps per row of the table")
    parser.add_argument("--capacity", type=int, default=None)
    parser.add_argument("--tree", default=str(pathlib.Path(__file__).resolve().parents[1]))
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from benchmarks import save

    env = {**os.environ, "ONEDNN_VERBOSE": "2", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": args.tree}
    if args.capacity is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(args.capacity)
    result = subprocess.run([sys.executable, "-c", CHILD, args.precision, str(args.steps),
                             str(args.news_dir)], env=env,
                            capture_output=True, text=True, cwd=args.tree)
    if result.returncode:
        raise RuntimeError(f"the training run failed:\n{result.stderr[-4000:]}")
    built, times = creations(result.stdout.splitlines())
    rows = []
    for start in range(0, args.steps, args.window):
        steps = [s for s in range(start, min(start + args.window, args.steps)) if s in times]
        if not steps:
            continue
        kinds = collections.Counter()
        for s in steps:
            for kind, ms in built[s]:
                kinds[kind] += ms / len(steps)
        rows.append({"steps": [steps[0], steps[-1]],
                     "built_per_step": statistics.mean(len(built[s]) for s in steps),
                     "build_ms_per_step": statistics.mean(sum(ms for _, ms in built[s])
                                                          for s in steps),
                     "by_kind_ms_per_step": dict(kinds.most_common()),
                     "step_s_median": statistics.median(times[s] for s in steps)})
    report = {"hardware": hardware(), "precision": args.precision, "steps": args.steps,
              "capacity": args.capacity, "tree": commit(args.tree), "windows": rows}
    save(args.out or f"benchmarks/results/product_shapes_{args.precision}.json", report,
         markdown(report))


def markdown(report):
    capacity = report["capacity"] or "as set by keras_transformer (4,096) or the environment"
    lines = [f"{describe_hardware(report['hardware'])}; the trainer's model (tiny, "
             f"{report['precision']}) on {report['steps']} consecutive news batches, tree "
             f"{report['tree']}; oneDNN primitive cache capacity {capacity}",
             "", "| steps | products built a step | ms building a step | of which (ms) | "
             "step (median, verbose log on) |", "|---|---|---|---|---|"]
    for row in report["windows"]:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in row["by_kind_ms_per_step"].items())
        lines.append(f"| {row['steps'][0]}-{row['steps'][1]} | {row['built_per_step']:.1f} | "
                     f"{row['build_ms_per_step']:.1f} | {kinds} | {row['step_s_median']:.3f} s |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
