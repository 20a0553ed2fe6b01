"""What hand-written kernels buy end to end: `python -m trainers.wmt` on the sample corpus (the
quick start's corpus, model and batch budget) with the library's kernels, with each one
replaced by the stock Keras/TensorFlow version, and with all replaced, alternated, for the same
wall-clock each.

    python -m benchmarks.kernels [--minutes 1.5] [--repeats 2]
        [--out benchmarks/results/kernels_now.json]

What it replaces (`KERNELS`): the 16-bit `Dropout` (stock: `keras.layers.Dropout`), the one
left. At commit 4434798 it also replaced `FusedAdam` (TensorFlow's fused Adam kernel; stock:
`keras.optimizers.Adam`), the closed-form `LayerNorm` gradient (stock: autodiff of the same
formula) and the hand-written label-smoothed loss gradient (stock:
`tf.nn.softmax_cross_entropy_with_logits` on the smoothed one-hot target): none gained beyond
the run-to-run spread (benchmarks/results/kernels.md, kernels_round1.md), so the library now
uses the stock versions. Reports real target tokens per second (tracing excluded) and the
ratio to the run with the kernels; the CPU model, its flags and the float32 matmul peak are
printed beside the figures.
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile

from benchmarks.end_to_end import CORPORA, ROOT, describe_hardware, timed_training_flags

KERNELS = ("dropout",)
VARIANTS = {"hand-written": (), **{f"stock {k}": (k,) for k in KERNELS}}


def use_stock(kernels):
    """Replaces the named hand-written kernels with the stock versions in this process (call it
    before training starts)."""
    import keras

    from keras_transformer import dropout

    if "dropout" in kernels:
        dropout.Dropout.call = keras.layers.Dropout.call


LAUNCH = ("import sys; from benchmarks.kernels import use_stock; use_stock(sys.argv[1].split(',')); "
          "from trainers.wmt import main; sys.exit(main(sys.argv[2:]))")


def run(kernels, minutes, work):
    settings = CORPORA["sample"]
    model_dir = work / f"run-{random.random():.6f}"
    command = [sys.executable, "-c", LAUNCH, ",".join(kernels), "--dataset", "sample",
               "--preset", "tiny", "--vocab_size", str(settings["vocab_size"]),
               "--batch_tokens", str(settings["batch_tokens"]),
               "--max_train_length", str(settings["max_length"]),
               "--warmup_steps", str(settings["warmup_steps"]),
               "--lr_scale", str(settings["lr_scale"]), "--precision", "float32",
               *timed_training_flags(minutes), "--no_eval", "--model_dir", str(model_dir),
               "--verbose", "2"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the trainer failed:\n{result.stderr[-4000:]}")
    summary = json.loads((model_dir / "train_summary.json").read_text())
    return {"target_tokens_per_s": summary["tokens_per_second"], "steps": summary["steps"],
            "final_loss": summary["final_loss"]}


def markdown(report):
    h = report["hardware"]
    lines = [f"{describe_hardware(h)}; "
             f"the sample corpus, tiny preset, float32, {report['minutes']:g} minutes a run",
             "", "| kernels | real target tokens/s (each run) | median | vs hand-written |",
             "|---|---|---|---|"]
    base = report["median"]["hand-written"]
    for name, runs in report["runs"].items():
        each = ", ".join(f"{r['target_tokens_per_s']:,.0f}" for r in runs)
        median = report["median"][name]
        lines.append(f"| {name} | {each} | {median:,.0f} | {median / base:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/kernels_now.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.end_to_end import hardware

    report = {"minutes": args.minutes, "hardware": hardware(),
              "runs": {name: [] for name in VARIANTS}}
    work = pathlib.Path(tempfile.mkdtemp(prefix="kt-kernels-"))
    for _ in range(args.repeats):  # alternated, so drift hits every variant alike
        for name, kernels in VARIANTS.items():
            report["runs"][name].append(run(kernels, args.minutes, work))
            print(name, report["runs"][name][-1], flush=True)
    report["median"] = {name: statistics.median(r["target_tokens_per_s"] for r in runs)
                        for name, runs in report["runs"].items()}
    from benchmarks import save

    save(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
