"""Restart time of a killed run: how long a resumed run takes from launch to its first trained
step, against a fresh run's launch to its first step (what resuming adds, or saves).

    python -m benchmarks.restart [--steps 1000] [--baseline /path/to/an/older/checkout]

Trains `--steps` steps of a small model on the sample corpus (2,048-token batches, a backup at
the end), then launches the same command with twice the steps and one checkpoint per step and
times the launch to the log line of the first new checkpoint; a fresh model_dir gives the
fresh start. `--baseline` measures another checkout the same way (one without
--backup_every_steps backs up every --validate_every_steps, here the same N steps), side by side.
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = ["--dataset", "sample", "--num_layers", "1", "--d_model", "32", "--d_ff", "64",
         "--num_heads", "2", "--vocab_size", "500", "--batch_tokens", "2048",
         "--max_train_length", "64", "--warmup_steps", "20", "--no_eval", "--no_validation",
         "--strategy", "default", "--verbose", "2"]


def seconds_until(tree, args, marker):
    """Launches the trainer of checkout `tree` and returns the seconds until `marker` is logged."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "trainers.wmt", *SMALL, *args], cwd=tree,
                               env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if marker in line:
            elapsed = time.monotonic() - start
            process.kill()
            process.wait()
            return elapsed
    raise RuntimeError(f"{tree}: the trainer ended before logging {marker!r}")


def measure(tree, steps, work):
    """(fresh start, resumed start) seconds for checkout `tree`."""
    with_backup = "--backup_every_steps" in subprocess.run(
        [sys.executable, "-m", "trainers.wmt", "--help"], cwd=tree, capture_output=True,
        text=True).stdout
    extra = ["--backup_every_steps", str(steps)] if with_backup else []
    run_dir = work / f"{pathlib.Path(tree).name}-run"
    subprocess.run([sys.executable, "-m", "trainers.wmt", *SMALL, "--train_steps", str(steps),
                    "--validate_every_steps", str(steps), *extra, "--model_dir", str(run_dir)],
                   cwd=tree, check=True, capture_output=True)
    more = ["--train_steps", str(2 * steps), "--validate_every_steps", str(steps),
            "--checkpoint_every_steps", "1", *extra]
    fresh = seconds_until(tree, [*more, "--model_dir", str(work / "fresh")], "ckpt-00000001")
    shutil.rmtree(work / "fresh")
    resumed = seconds_until(tree, [*more, "--model_dir", str(run_dir)], f"ckpt-{steps + 1:08d}")
    return fresh, resumed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--baseline", default=None, help="another checkout, measured alike")
    args = parser.parse_args()
    from benchmarks.end_to_end import hardware

    machine = hardware()
    print(f"{machine['cpu']}, {machine['cores']} cores, flags {' '.join(machine['flags'])}")
    with tempfile.TemporaryDirectory() as work:
        for tree in [ROOT] + ([args.baseline] if args.baseline else []):
            fresh, resumed = measure(tree, args.steps, pathlib.Path(work))
            print(f"{tree}: launch to first step {fresh:.1f} s fresh, {resumed:.1f} s resumed at "
                  f"step {args.steps} ({resumed - fresh:+.1f} s)", flush=True)


if __name__ == "__main__":
    main()
