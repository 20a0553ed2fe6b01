"""Kill-anywhere check (issue 23, item 2): a run killed with SIGKILL at seeded moments, and
started again with the same command after each kill, ends as an uninterrupted run does.

    python -m benchmarks.chaos [--kills 12] [--seed 0] [--work DIR] [--results FILE]

Trains a small model on the sample corpus with --deterministic (40 steps, a backup every 5, a
checkpoint every 5, validation and best/ every 20, then averaging, beam-search evaluation and
the SavedModel export). The kills are drawn, with `--seed`, from: inside a backup write (the
moment its .partial folder appears), inside a checkpoint write (its hidden .partial file),
inside checkpoint averaging (its first "averaging: reading" line), inside the export (its
staging folder), and at a random second of a run. One more event truncates the newest backup's
weights file, as a full disk would, to check that it is passed over, with a log line, for the
backup before it. After the last kill the command runs to its end; then the checks:

- the checkpoints, best/, averaged weights and the exported model's translations equal those
  of the same command run once without a kill (a fresh folder);
- every weights file under checkpoints/, backup/ and best/ opens, every export version is
  complete, and no half-written file has a name that a later step reads;
- train_summary.json counts the run's steps.

Prints a table of the kill moments and outcomes, and writes it with `--results`.
"""

import argparse
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 40
COMMAND = ["--dataset", "sample", "--num_layers", "1", "--d_model", "32", "--d_ff", "64",
           "--num_heads", "2", "--vocab_size", "500", "--batch_tokens", "512",
           "--max_train_length", "32", "--warmup_steps", "20", "--precision", "float32",
           "--strategy", "default", "--deterministic", "--train_steps", str(STEPS),
           "--validate_every_steps", "20", "--backup_every_steps", "5", "--checkpoint_every_steps",
           "5", "--checkpoint_every_minutes", "0", "--eval_every_steps", "20",
           "--eval_sentences", "8", "--average_last", "3", "--eval_splits", "test",
           "--eval_max_sentences", "12", "--beam_size", "2", "--verbose", "2"]
# Where each kind of kill strikes: a path that exists only while its write is under way
# (one left by an earlier kill does not count), or a line of the log.
WRITES = {"backup write": "backup/local/epoch-*.partial",
          "checkpoint write": "checkpoints/.ckpt-*.partial*",
          "export": "export/.*.tmp"}


def files_being_written(run, kind):
    """{path: (inode, mtime, size)} of the partial files of `kind` present now."""
    found = {}
    for path in run.glob(WRITES[kind]):
        try:
            info = path.stat()
        except FileNotFoundError:  # renamed into place since the glob
            continue
        found[path] = (info.st_ino, info.st_mtime_ns, info.st_size)
    return found


def moment_came(run, log, kind, before):
    if kind == "averaging":
        return "averaging: reading" in log
    now = files_being_written(run, kind)
    return any(before.get(path) != state for path, state in now.items())
TRAINING_KINDS = ("backup write", "checkpoint write")
AFTER_TRAINING_KINDS = ("averaging", "export")


def launch(run, log_path):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "trainers.wmt", *COMMAND, "--model_dir",
                             str(run)], cwd=ROOT, env=environment, stdout=log,
                            stderr=subprocess.STDOUT)


def kill_when(run, log_path, kind, delay=None, limit=600):
    """Starts the command and kills it at `kind`'s moment (or after `delay` seconds). Returns
    (what happened, seconds, the log)."""
    before = files_being_written(run, kind) if kind in WRITES else {}
    process = launch(run, log_path)
    start = time.monotonic()
    struck = None
    while process.poll() is None and time.monotonic() - start < limit:
        log = log_path.read_text(errors="replace")
        if delay is not None:
            hit = time.monotonic() - start >= delay
        else:
            hit = moment_came(run, log, kind, before)
        if hit:
            process.send_signal(signal.SIGKILL)
            struck = "killed"
            break
        time.sleep(0.002)
    process.wait()
    seconds = time.monotonic() - start
    log = log_path.read_text(errors="replace")
    if struck is None:
        struck = f"ran to its end (exit {process.returncode}) before the moment came"
    elif delay is None and not moment_came(run, log, kind, before):
        struck = "killed just after the write ended"  # the rename won the race
    elif delay is None:
        struck = "killed inside it"
    return struck, seconds, log


def resumed_step(log):
    found = re.search(r"Resumed at step (\d+)", log)
    return int(found.group(1)) if found else None


def h5_arrays(path):
    import h5py
    import numpy as np

    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, np.asarray(item))
                     if hasattr(item, "shape") else None)
    return arrays


def same_weights(a, b):
    import numpy as np

    x, y = h5_arrays(a), h5_arrays(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def check(run, reference):
    """The checks of the module docstring; returns [(what, passed, detail)]."""
    import h5py

    results = []
    names = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.weights.h5"))
    expected = sorted(p.name for p in (reference / "checkpoints").glob("ckpt-*.weights.h5"))
    results.append(("checkpoints kept: the same steps", names == expected, ", ".join(names)))
    results.append(("every checkpoint equals the uninterrupted run's",
                    names == expected and all(same_weights(run / "checkpoints" / n,
                                                           reference / "checkpoints" / n)
                                              for n in names), f"{len(names)} files"))
    results.append(("averaged.weights.h5 equals the uninterrupted run's",
                    same_weights(run / "averaged.weights.h5",
                                 reference / "averaged.weights.h5"), ""))
    best = json.loads((run / "best/best.json").read_text())
    best_files = sorted((run / "best").glob("ckpt-*.weights.h5"))
    results.append(("best/ names one whole file, the uninterrupted run's",
                    best == json.loads((reference / "best/best.json").read_text())
                    and [p.name for p in best_files] == [f"ckpt-{best['step']:08d}.weights.h5"]
                    and same_weights(best_files[0], reference / "best" / best_files[0].name),
                    f"step {best['step']}"))
    unreadable = []
    for path in [*run.glob("checkpoints/*.h5"), *run.glob("backup/**/*.h5"),
                 *run.glob("best/*.h5"), run / "averaged.weights.h5"]:
        if path.name.startswith("."):
            continue
        try:
            with h5py.File(path, "r"):
                pass
        except OSError as error:
            if path.parent.name != TRUNCATED.get("folder"):  # the one truncated on purpose
                unreadable.append(f"{path}: {error}")
    results.append(("every weights file a later step reads opens", not unreadable,
                    "; ".join(unreadable) or "all open"))
    versions = sorted(p for p in (run / "export").iterdir() if not p.name.startswith("."))
    whole = [p for p in versions if (p / "saved_model.pb").exists()
             and (p / "variables/variables.index").exists()]
    results.append(("every export version is complete", versions and whole == versions,
                    ", ".join(p.name for p in versions)))
    results.append(("the export translates as the uninterrupted run's does",
                    export_translations(versions[-1]) ==
                    export_translations(sorted((reference / "export").iterdir())[-1]), ""))
    summary = json.loads((run / "train_summary.json").read_text())
    results.append(("train_summary.json counts the steps", summary["steps"] == STEPS,
                    f"steps {summary['steps']}"))
    leftovers = sorted(str(p.relative_to(run)) for p in run.rglob(".*"))
    results.append(("half-written files left (hidden names, never read)", None,
                    ", ".join(leftovers) or "none"))
    return results


TRUNCATED = {}


def export_translations(version_dir):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    sentences = ["The dog sleeps.", "A small house.", "Where is the station?"]
    served = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    outputs = served(inputs=tf.constant(sentences))
    return [t.decode() for t in outputs["translations"].numpy().ravel()]


def plan(kills, seed):
    """The kill moments, seeded: training ones first, then those after training."""
    rng = random.Random(seed)
    training = [*TRAINING_KINDS * 2, *["random second"] * max(kills - 8, 2)]
    rng.shuffle(training)
    after = [*AFTER_TRAINING_KINDS * 2]
    rng.shuffle(after)
    events = training[:max(kills - len(after), 1)]
    events.insert(rng.randrange(1, len(events)), "truncate the newest backup")
    return events + after, rng


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="folder for the two runs (default: temp)")
    parser.add_argument("--results", default=None, help="write the report (markdown) here")
    args = parser.parse_args(argv)
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    run, reference = work / "killed", work / "whole"
    events, rng = plan(args.kills, args.seed)
    rows = []
    for number, kind in enumerate(events, 1):
        log_path = work / f"log-{number:02d}.txt"
        if kind == "truncate the newest backup":
            from trainers.backup import completed_backups

            newest = completed_backups(run / "backup/local")[-1]
            state = newest / "state.weights.h5"
            state.write_bytes(state.read_bytes()[:state.stat().st_size // 2])
            TRUNCATED["folder"] = newest.name
            rows.append((number, kind, 0.0, f"{newest.name}/state.weights.h5 cut to half", ""))
            continue
        delay = rng.uniform(8, 40) if kind == "random second" else None
        struck, seconds, log = kill_when(run, log_path, kind, delay)
        step = resumed_step(log)
        passed_over = "unreadable" in log
        outcome = (f"started at step {step}" if step is not None else "started fresh")
        if passed_over:
            outcome += (f" (the truncated {TRUNCATED.get('folder')} passed over, logged as "
                        "unreadable)")
        what = kind if delay is None else f"{kind} ({delay:.1f} s)"
        rows.append((number, what, seconds, struck, outcome))
        print(f"{number:2d}. {what}: {struck} after {seconds:.1f} s; {outcome}", flush=True)
    final = subprocess.run([sys.executable, "-m", "trainers.wmt", *COMMAND, "--model_dir",
                            str(run)], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                "CUDA_VISIBLE_DEVICES": ""})
    (work / "log-final.txt").write_text(final.stdout + final.stderr)
    whole = subprocess.run([sys.executable, "-m", "trainers.wmt", *COMMAND, "--model_dir",
                            str(reference)], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                "CUDA_VISIBLE_DEVICES": ""})
    (work / "log-whole.txt").write_text(whole.stdout + whole.stderr)
    if final.returncode or whole.returncode:
        print(final.stderr[-3000:], whole.stderr[-3000:], file=sys.stderr)
        return 1
    results = check(run, reference)
    lines = ["| # | kill | after (s) | what it struck | the next run |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {k} | {s:.1f} | {w} | {o} |" for n, k, s, w, o in rows]
    lines += ["", f"Final run: {'resumed at step ' + str(resumed_step(final.stdout)) if resumed_step(final.stdout) is not None else 'no resume'}, exit {final.returncode}.", "",
              "| check | passed | detail |", "|---|---|---|"]
    verdicts = {True: "yes", False: "**NO**", None: "(report)"}
    lines += [f"| {what} | {verdicts[ok]} | {detail} |" for what, ok, detail in results]
    report = "\n".join(lines)
    print(report)
    if args.results:
        pathlib.Path(args.results).write_text(
            f"# `python -m benchmarks.chaos --kills {args.kills} --seed {args.seed}`\n\n"
            + report + "\n")
    return 0 if all(ok is not False for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
