"""How a real training run's steps compare with its steady step: `python -m trainers.wmt` on the
news corpus at the end-to-end benchmark's settings, its own pipeline and callbacks, with a clock
on every call into the step (--steps_per_execution steps each). Each call's wall clock, the
process's CPU use during it and the main Python thread's CPU seconds; the calls' excess over
the last epoch's median call says how much of the run is not the steady step (warm-up at new
shapes, the input pipeline tokenizing a new window beside the step, checkpoints and backups).
Give it at least two epochs (100 steps each): the first epoch's median can itself be slow.

    python -m benchmarks.run_clock [--precision mixed_bfloat16] [--minutes 3] [--news_dir DIR]
        [--out benchmarks/results/run_clock_news_<precision>.json]

As the trainer's own figures (`Throughput`), each epoch's first call is left out of the timed
calls: it holds the tracing, and its clock starts before the epoch's first batch is read.
"""

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

from benchmarks.end_to_end import NEWS_DIR, describe_hardware, hardware, timed_training_flags
from benchmarks.step_profile import corpus_flags


def clocked_run(flags):
    """(calls, summary): `python -m trainers.wmt flags` in this process, and for each call into
    the step its epoch, last batch index, wall seconds, process CPU seconds and main-thread CPU
    seconds; the run's train_summary.json."""
    import keras

    from trainers import training, wmt

    calls = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.start = (time.perf_counter(), time.process_time(), time.thread_time())

        def on_train_batch_end(self, batch, logs=None):
            wall, cpu, thread = self.start
            calls.append({"epoch": self.epoch, "batch": batch,
                          "seconds": time.perf_counter() - wall,
                          "cpu_seconds": time.process_time() - cpu,
                          "main_thread_cpu_seconds": time.thread_time() - thread})

    make_callbacks = training.make_callbacks
    training.make_callbacks = lambda *args, **kwargs: make_callbacks(*args, **kwargs) + [Clock()]
    model_dir = tempfile.mkdtemp(prefix="kt-run-clock-")
    try:
        wmt.main(flags + ["--model_dir", model_dir])
    finally:
        training.make_callbacks = make_callbacks
    return calls, json.loads(pathlib.Path(model_dir, "train_summary.json").read_text())


def clock_report(calls, summary):
    """The calls (`clocked_run`) beside the last epoch's median call: each epoch's first call
    left out, as the trainer's `Throughput` does."""
    timed = [c for before, c in zip([None] + calls, calls)
             if before is not None and before["epoch"] == c["epoch"]]
    seconds_by_epoch = {}
    for c in timed:
        seconds_by_epoch.setdefault(c["epoch"] + 1, []).append(c["seconds"])
    medians = {epoch: statistics.median(s) for epoch, s in seconds_by_epoch.items()}
    median = medians[max(medians)]
    return {"summary": {k: v for k, v in summary.items() if k != "epochs"},
            "median_call_s_by_epoch": medians, "median_call_s": median,
            "timed_s": sum(c["seconds"] for c in timed),
            "excess_over_median_s": sum(c["seconds"] - median for c in timed),
            "calls": calls}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import save

    flags = (corpus_flags("news", args.news_dir, args.precision)
             + timed_training_flags(args.minutes) + ["--no_eval", "--no_export", "--verbose", "0"])
    calls, summary = clocked_run(flags)
    report = clock_report(calls, summary)
    report.update(hardware=hardware(), precision=args.precision, minutes=args.minutes)
    save(args.out or f"benchmarks/results/run_clock_news_{args.precision}.json", report,
         markdown(report))


def markdown(report):
    s = report["summary"]
    lines = [f"{describe_hardware(report['hardware'])}; `python -m trainers.wmt` on the news "
             f"corpus, {report['precision']}, {report['minutes']:g} minutes: {s['steps']} steps, "
             f"{s['tokens_per_second']:,.0f} real target tokens/s, CPU use "
             f"{100 * s['cpu_use']:.0f}%",
             "",
             f"Timed calls (each epoch's first left out): {report['timed_s']:.1f} s; the median "
             "call by epoch " + ", ".join(f"{epoch}: {seconds:.3f} s" for epoch, seconds
                                          in report["median_call_s_by_epoch"].items())
             + f"; the excess over the last epoch's median {report['excess_over_median_s']:.1f} s "
             f"({100 * report['excess_over_median_s'] / report['timed_s']:.1f}% of the timed "
             "calls)",
             "", "| epoch | last batch | seconds | over the median | CPU use (of all cores) "
             "| main thread CPU s |", "|---|---|---|---|---|---|"]
    cores = os.cpu_count()
    for c in report["calls"]:
        lines.append(f"| {c['epoch'] + 1} | {c['batch']} | {c['seconds']:.2f} | "
                     f"{c['seconds'] - report['median_call_s']:+.2f} | "
                     f"{100 * c['cpu_seconds'] / (c['seconds'] * cores):.0f}% | "
                     f"{c['main_thread_cpu_seconds']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
