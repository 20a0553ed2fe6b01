"""Where one training step goes: the trainer's own model, loss, metrics and optimizer
(trainers.training.compiled_model) on real batches from its own input pipeline, profiled with
the TensorFlow profiler; op time grouped by op type and by part of the step, beside the step's
matmul floor (benchmarks.training.matmul_floor: exactly the step's matrix products, alone).

    python -m benchmarks.step_profile [--corpus news|sample] [--precision float32]
        [--steps 8] [--warmup 100] [--news_dir DIR]
        [--out benchmarks/results/step_profile_<corpus>_<precision>.json]

The profiled steps come after --warmup steps on as many other batches: the first few dozen
steps of a run are slower than the rest, since oneDNN builds its products for each shape it
has not kept yet and XLA compiles the loss and the Add & Norm for each new padded row count.

Op times are summed over TensorFlow's threads (2 on a 2-core machine), so shares are of the
op time, not of the wall clock; the wall-clock step time and the floor are measured apart.
The op events are also laid on one time line: how much of the wall clock some matrix product
runs, only other ops run (and which), or nothing runs (waiting on the host, or XLA compiling
the loss or an Add & Norm for a token count it has not seen).
"""

import argparse
import collections
import glob
import os
import pathlib
import statistics
import tempfile
import time

from benchmarks.end_to_end import (CORPORA, NEWS_DIR, describe_hardware, hardware,
                                   matmul_floor_of, news_corpus, trainer_batches)

# The part of the step an op belongs to, by its name scope (Keras computes the compiled
# metrics outside any scope of their own: they are the rest).
PARTS = (("optimizer", ("token_weighted_adam/", "/adam/")),
         ("loss", ("compile_loss/",)),
         ("backward", ("gradient_tape/",)),
         ("forward", ("/transformer",)))


def part_of(name):
    for part, markers in PARTS:
        if any(marker in name for marker in markers):
            return part
    return "metrics and the rest"


def op_events(logdir):
    """(start, end, op type, part) of each TensorFlow op and XLA program in the profile, in
    picoseconds on the host's clock."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
        space = xplane_pb2.XSpace()
        space.ParseFromString(pathlib.Path(path).read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    end = start + event.duration_ps
                    if name == "CpuExecutable::ExecuteAsyncOnStream":
                        # An XLA-compiled program, whose ops are not TensorFlow ops: in the
                        # trainer's step, the loss and its gradient (losses.py), and under
                        # mixed_bfloat16 the Add & Norms forward and backward (layer_norm.py).
                        # The profile does not name the program.
                        yield start, end, "XLA program", "loss; Add & Norm (bfloat16)"
                    elif ":" in name and name.startswith("StatefulPartitionedCall"):
                        scope, kind = name.rsplit(":", 1)
                        yield start, end, kind, part_of(scope)


def op_times(logdir):
    """{(op type, part): seconds} summed over the profile's TensorFlow op events and XLA
    programs."""
    times = collections.Counter()
    for start, end, kind, part in op_events(logdir):
        times[(kind, part)] += (end - start) / 1e12
    return times


def is_matmul(kind):
    return "MatMul" in kind or "Einsum" in kind


def wall_clock(logdir):
    """Seconds of the profile's wall clock (first op to last) during which some matrix
    product runs ("matmul running"), only other ops run ("other ops only"), or no op runs
    ("nothing running"); and {(op type, part): seconds} of the second, each instant shared
    among the ops running then."""
    events = list(op_events(logdir))
    edges = sorted([(start, 1, i) for i, (start, *_) in enumerate(events)]
                   + [(end, -1, i) for i, (_, end, *_) in enumerate(events)])
    spans = collections.Counter()
    others = collections.Counter()
    running = set()
    for (time_ps, change, i), (next_ps, *_) in zip(edges, edges[1:] + edges[-1:]):
        if change > 0:
            running.add(i)
        else:
            running.discard(i)
        seconds = (next_ps - time_ps) / 1e12
        if not running:
            spans["nothing running"] += seconds
        elif any(is_matmul(events[j][2]) for j in running):
            spans["matmul running"] += seconds
        else:
            spans["other ops only"] += seconds
            for j in running:
                others[events[j][2:]] += seconds / len(running)
    return spans, others


def corpus_flags(corpus, news_dir, precision):
    """The trainer's flags for tiny on `corpus` ("news" or "sample") at the end-to-end
    benchmark's settings for it."""
    s = CORPORA[corpus]
    flags = ["--dataset", "sample"]
    if corpus == "news":
        flags = ["--dataset", "files", "--train_files", *map(str, news_corpus(news_dir)["train"])]
    return flags + ["--preset", "tiny", "--precision", precision,
                    "--vocab_size", str(s["vocab_size"]), "--batch_tokens", str(s["batch_tokens"]),
                    "--max_train_length", str(s["max_length"]), "--max_length", "256",
                    "--warmup_steps", str(s["warmup_steps"]), "--lr_scale", str(s["lr_scale"])]


def trainer_setup(corpus_args):
    """(config, settings, model, batches) as `python -m trainers.wmt corpus_args` builds them."""
    import tensorflow as tf
    import keras

    import keras_transformer as kt
    from trainers import training

    config, settings, batches = trainer_batches(corpus_args)
    keras.mixed_precision.set_global_policy(settings.precision)
    schedule = kt.TransformerSchedule(config.d_model, config.warmup_steps, settings.lr_scale)
    model = training.compiled_model(settings, config, schedule, tf.distribute.get_strategy())
    return config, settings, model, batches


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("news", "sample"), default="news")
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=100,
                        help="steps before the profile, each on a batch of its own")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from benchmarks import save

    config, settings, model, batches = trainer_setup(
        corpus_flags(args.corpus, args.news_dir, args.precision))
    fixed = list(batches.take(args.warmup + 2 * args.steps).as_numpy_iterator())
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(fixed), output_signature=batches.element_spec)

    step_times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])
            step_times.append(time.perf_counter() - self.start)

    model.fit(dataset, steps_per_epoch=args.warmup, epochs=1, verbose=0, callbacks=[Timer()])
    step_times.clear()
    model.fit(dataset.skip(args.warmup), steps_per_epoch=args.steps, epochs=1, verbose=0,
              callbacks=[Timer()])
    logdir = tempfile.mkdtemp(prefix="kt-profile-")
    tf.profiler.experimental.start(logdir)
    model.fit(dataset.skip(args.warmup + args.steps), steps_per_epoch=args.steps, epochs=1,
              verbose=0)
    tf.profiler.experimental.stop()
    times = op_times(logdir)
    spans, others = wall_clock(logdir)

    profiled = fixed[args.warmup:args.warmup + args.steps]
    floor, real = matmul_floor_of(config, profiled, args.precision)
    step = statistics.median(step_times)
    total = sum(times.values())
    by_type, by_part = collections.Counter(), collections.Counter()
    for (kind, part), seconds in times.items():
        by_type[kind] += seconds
        by_part[part] += seconds
    report = {"hardware": hardware(), "corpus": args.corpus, "precision": args.precision,
              "steps": args.steps, "step_s": step, "matmul_floor_s": floor,
              "real_target_tokens_per_step": real, "tokens_per_second": real / step,
              "op_seconds_per_step": total / args.steps,
              "by_part": {k: v / total for k, v in by_part.most_common()},
              "by_type": {k: v / total for k, v in by_type.most_common()},
              "top": [{"op": kind, "part": part, "share": seconds / total}
                      for (kind, part), seconds in times.most_common(args.top)],
              "wall_clock_per_step_s": {k: v / args.steps for k, v in spans.items()},
              "other_ops_only_per_step_s": [
                  {"op": kind, "part": part, "seconds": seconds / args.steps}
                  for (kind, part), seconds in others.most_common(args.top)]}
    save(args.out or f"benchmarks/results/step_profile_{args.corpus}_{args.precision}.json",
         report, markdown(report))


def markdown(report):
    h = report["hardware"]
    lines = [f"{describe_hardware(h)}; "
             f"tiny on the {report['corpus']} corpus, {report['precision']}, the trainer's own "
             f"batches ({report['real_target_tokens_per_step']:,.0f} real target tokens a step)",
             "",
             f"step {report['step_s']:.3f} s (median), matmul floor {report['matmul_floor_s']:.3f}"
             f" s: step/floor **{report['step_s'] / report['matmul_floor_s']:.2f}**; "
             f"{report['tokens_per_second']:,.0f} real target tokens/s",
             "", "| part of the step | share of op time |", "|---|---|"]
    lines += [f"| {k} | {100 * v:.1f}% |" for k, v in report["by_part"].items()]
    lines += ["", "| op type | part | share of op time |", "|---|---|---|"]
    lines += [f"| {t['op']} | {t['part']} | {100 * t['share']:.1f}% |" for t in report["top"]]
    if "wall_clock_per_step_s" in report:
        spans = report["wall_clock_per_step_s"]
        lines += ["", "Wall clock of the profiled steps, per step: " + ", ".join(
            f"{k} {1000 * spans.get(k, 0.0):.0f} ms"
            for k in ("matmul running", "other ops only", "nothing running")),
            "", "| while no matrix product runs: op type | part | ms a step |", "|---|---|---|"]
        lines += [f"| {t['op']} | {t['part']} | {1000 * t['seconds']:.1f} |"
                  for t in report["other_ops_only_per_step_s"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
