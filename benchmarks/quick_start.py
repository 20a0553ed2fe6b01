"""The README's quick start as a newcomer runs it, timed by phase: `python -m trainers.wmt
--strategy mirrored --dataset sample` in a fresh folder, once per source tree, the trees one
after the other (--repeats rounds, alternating), with the CPU model and flags beside the
figures, the CPU time each run used and its test BLEU.

    git worktree add /tmp/old <commit>
    python -m benchmarks.quick_start --trees /tmp/old,. [--repeats 1] [--precision auto]
        [--out benchmarks/results/quick_start_<precision>.json] [--logs DIR]

Phases, from the moment each line of the run's output appears: start (to Keras' first "Epoch"
line: imports, vocabulary, model), training (to "trained to step": the steps, with the BLEU
and validation-loss evaluations during training), test (averaging and the beam search of the
test split, to its "test:" line) and export (to the end). The pause at the end of `fit` is the
time from the last "backed up step" line to "trained to step" (tf.data iterators deleted there
waited on a tuning thread, README). CPU use is the run's user + system
time over its wall-clock times the cores. The vocabulary is the cached one (a machine's first
run trains it, about 20 s more).
"""

import argparse
import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks import save

COMMAND = ["-m", "trainers.wmt", "--strategy", "mirrored", "--dataset", "sample"]
MARKS = (("start", re.compile(r"^Epoch 1/")), ("training", re.compile(r"^trained to step")),
         ("test", re.compile(r"^test: BLEU")))


def run_once(tree, precision, log_path=None):
    """Runs the quick start from `tree` in a fresh folder; returns its figures. With
    `log_path`, writes the run's output there, each line after its time in the run."""
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(tree).resolve()),
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    flags = [] if precision is None else ["--precision", precision]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as folder:
        began = time.monotonic()
        process = subprocess.Popen([sys.executable, *COMMAND, *flags], cwd=folder, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        marks, lines, stamped, last_backup = {}, [], [], None
        for line in process.stdout:
            now = time.monotonic() - began
            lines.append(line)
            stamped.append(f"{now:7.1f} {line}")
            if "training" not in marks and "backed up step" in line:
                last_backup = now
            for name, pattern in MARKS:
                if name not in marks and pattern.search(line):
                    marks[name] = now
        if process.wait():
            raise SystemExit(f"{tree}: the quick start failed:\n{''.join(lines[-20:])}")
        total = time.monotonic() - began
    if log_path is not None:
        pathlib.Path(log_path).write_text("".join(stamped))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = "".join(lines)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ends = [marks["start"], marks["training"], marks["test"], total]
    phases = dict(zip(("start", "training", "test", "export"),
                      [b - a for a, b in zip([0.0, *ends], ends)]))
    return {"tree": tree, "commit": commit(tree), "seconds": total,
            **{f"{name}_seconds": seconds for name, seconds in phases.items()},
            "end_of_fit_pause_seconds": (None if last_backup is None
                                         else marks["training"] - last_backup),
            "cpu_use": cpu / (total * os.cpu_count()),
            "tokens_per_second": float(re.search(r"trained to step \d+: ([\d,]+) real",
                                                 text)[1].replace(",", "")),
            "test_bleu": float(re.search(r"^test: BLEU = ([\d.]+)", text, re.M)[1]),
            "precision": re.search(r"^precision (\S+)", text, re.M)[1]}


def commit(tree):
    """The tree's commit (short hash, "+" when it has uncommitted changes), or "?"."""
    try:
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "-uno"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+" if dirty else "")


def pause(run):
    seconds = run.get("end_of_fit_pause_seconds")
    return "-" if seconds is None else f"{seconds:.1f} s"


def table(runs, machine):
    header = (f"{machine['cpu']}, {machine['cores']} cores, flags {' '.join(machine['flags'])}; "
              f"TensorFlow {machine['tensorflow']}; `python -m {' '.join(COMMAND[1:])}`, cached "
              "vocabulary, one fresh folder per run, the trees run one after the other\n\n"
              "| tree | precision | total | start | training | pause at the end of fit | "
              "test (average, beam search) | export | CPU use of 2 x wall | real target tok/s | "
              "test BLEU |\n|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [f"| {r['tree']} ({r['commit']}) | {r['precision']} | {r['seconds']:.0f} s | "
            f"{r['start_seconds']:.0f} s | {r['training_seconds']:.0f} s | "
            f"{pause(r)} | {r['test_seconds']:.0f} s | {r['export_seconds']:.0f} s | "
            f"{100 * r['cpu_use']:.0f}% | {r['tokens_per_second']:,.0f} | {r['test_bleu']:.2f} |"
            for r in runs]
    base = [r["seconds"] for r in runs if r["tree"] == runs[0]["tree"]]
    ratios = [f"{r['tree']}: {min(base) / r['seconds']:.2f}x" for r in runs[1:]
              if r["tree"] != runs[0]["tree"]]
    return "\n".join([header, *rows, "", f"speed-up over {runs[0]['tree']} (its fastest run "
                      f"over each run): {', '.join(ratios) or '-'}"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=".",
                        help="comma-separated source trees; the first is the base")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--precision", default=None,
                        help="passed to the trainer (default: the README's, auto)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--logs", default=None,
                        help="a folder for each run's output, its lines timed")
    args = parser.parse_args(argv)
    from benchmarks.end_to_end import hardware

    machine = hardware()
    trees = args.trees.split(",")
    runs = []
    for round_ in range(args.repeats):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            log_path = None
            if args.logs:
                pathlib.Path(args.logs).mkdir(parents=True, exist_ok=True)
                log_path = pathlib.Path(args.logs) / f"{len(runs) + 1}-{commit(tree)}.log"
            runs.append(run_once(tree, args.precision, log_path))
            print(runs[-1], flush=True)
    out = args.out or f"benchmarks/results/quick_start_{args.precision or 'auto'}.json"
    save(out, {"machine": machine, "runs": runs}, table(runs, machine))


if __name__ == "__main__":
    main()
