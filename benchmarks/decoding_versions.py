"""Decoding speed of two (or more) versions of this library side by side: each source tree
runs in its own worker process, and the workers take turns, one search call at a time, so the
machine's drift (about 10% in minutes on a small CPU) hits every tree alike. Runs measured one
after the other cannot show a change of a few percent; this can.

    git worktree add /tmp/old <commit>
    python -m benchmarks.decoding_versions --trees /tmp/old,. [--rounds 15]
        [--out benchmarks/results/decoding_versions.json]

Each worker builds the tiny preset (vocabulary 8,000, random weights seeded alike) and runs
greedy and beam-4 search, cached, with and without XLA, at batch 1 and 32, 24 source tokens
and 32 steps each (EOS disabled: every tree does the same work). Reported: the median and the
minimum over the rounds, and each tree's median as a multiple of the first tree's.
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

SOURCE_LENGTH, NEW_TOKENS, VOCAB = 24, 32, 8000


def worker():
    """Builds the model and the searches, then times search i for each line "i" read."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.decoding import beam_search, greedy_search

    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.preset("tiny", vocab_size=VOCAB, max_length=64)
    model = kt.Transformer(config)
    model.build()
    rng = np.random.default_rng(0)
    settings = dict(bos_id=1, eos_id=-1, max_extra=NEW_TOKENS - SOURCE_LENGTH)
    cases = []
    for batch in (1, 32):
        source = tf.constant(rng.integers(3, VOCAB, (batch, SOURCE_LENGTH)), tf.int32)
        for xla in (False, True):
            cases.append((f"greedy, batch {batch}, XLA {'on' if xla else 'off'}",
                          lambda s=source, x=xla: greedy_search(model, s, jit_compile=x,
                                                                **settings)))
            cases.append((f"beam 4, batch {batch}, XLA {'on' if xla else 'off'}",
                          lambda s=source, x=xla: beam_search(model, s, beam_size=4, alpha=0.0,
                                                              jit_compile=x, **settings)))
    for _, search in cases:  # trace and compile
        search()
    print("\t".join(name for name, _ in cases), flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        cases[int(line)][1]()
        print(time.perf_counter() - start, flush=True)


def run(trees, rounds):
    # This file runs as a script, so the worker imports `keras_transformer` from its tree
    # alone (an old tree need not have this benchmark).
    workers = [subprocess.Popen(
        [sys.executable, __file__, "--worker"],
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(tree).resolve())},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for tree in trees]
    names = [w.stdout.readline().strip().split("\t") for w in workers][0]
    times = {(tree, name): [] for tree in trees for name in names}
    for round_ in range(rounds):
        for index, name in enumerate(names):
            turn = list(zip(trees, workers))
            for tree, process in (turn if round_ % 2 == 0 else turn[::-1]):
                process.stdin.write(f"{index}\n")
                process.stdin.flush()
                times[(tree, name)].append(float(process.stdout.readline()))
    for process in workers:
        process.stdin.close()
        process.wait()
    rows = []
    for name in names:
        first = statistics.median(times[(trees[0], name)])
        for tree in trees:
            median = statistics.median(times[(tree, name)])
            rows.append({"search": name, "tree": tree, "median_ms": median * 1000,
                         "min_ms": min(times[(tree, name)]) * 1000,
                         "vs_first": median / first})
    return rows


def markdown(rows):
    lines = ["| search | tree | median ms | min ms | median / first tree's |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['search']} | {r['tree']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | "
              f"{r['vs_first']:.3f} |" for r in rows]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", help="comma-separated source trees; the first is the base")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/decoding_versions.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    from benchmarks import save
    from benchmarks.end_to_end import hardware

    machine = hardware()
    rows = run(args.trees.split(","), args.rounds)
    table = (f"Machine: {machine['cpu']}, {machine['cores']} cores, flags "
             f"{' '.join(machine['flags'])}, TF {machine['tensorflow']}; {args.rounds} rounds.\n\n"
             + markdown(rows))
    save(args.out, {"machine": machine, "rounds": args.rounds, "rows": rows}, table)


if __name__ == "__main__":
    main()
