"""What the trainer's input pipeline costs here: the training batches of `python -m
trainers.wmt` on a corpus (read, cleaned, shuffled, tokenized and packed as in training),
drawn as fast as they come, with the wall-clock and this process's CPU seconds for the first
batch (which waits for the shuffle buffer and the first window) and for the rest. On a
2-core machine every CPU second the pipeline takes during training is taken from the step.

    python -m benchmarks.input_pipeline [--corpus news|sample] [--batches 700]
        [--out benchmarks/results/input_pipeline_<corpus>.json]

Run it in two source trees (`cd TREE && python -m benchmarks.input_pipeline --out ...`) to
compare them.
"""

import argparse
import os
import time

from benchmarks.end_to_end import NEWS_DIR, describe_hardware, hardware, trainer_batches
from benchmarks.quick_start import commit
from benchmarks.step_profile import corpus_flags


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("news", "sample"), default="news")
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--batches", type=int, default=700)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import save

    _, settings, batches = trainer_batches(corpus_flags(args.corpus, args.news_dir, "float32"))
    batches = iter(batches)
    start, cpu_start = time.perf_counter(), time.process_time()
    next(batches)
    first, first_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    waits = []
    for _ in range(args.batches - 1):
        wait = time.perf_counter()
        next(batches)
        waits.append(time.perf_counter() - wait)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    report = {"hardware": hardware(), "corpus": args.corpus, "tree": commit("."),
              "batch_tokens": settings.batch_tokens, "batches": args.batches,
              "first_batch_s": first, "first_batch_cpu_s": first_cpu,
              "rest_s": total - first, "rest_cpu_s": total_cpu - first_cpu,
              "longest_wait_s": max(waits, default=0.0)}
    save(args.out or f"benchmarks/results/input_pipeline_{args.corpus}.json", report,
         markdown(report))


def markdown(r):
    return "\n".join([
        f"{describe_hardware(r['hardware'])}; tree {r['tree']}; the trainer's training "
        f"batches on the {r['corpus']} corpus (budget {r['batch_tokens']:,} tokens), drawn "
        "as fast as they come", "",
        "| batches | wall-clock | CPU seconds (this process, all threads) |", "|---|---|---|",
        f"| the first | {r['first_batch_s']:.2f} s | {r['first_batch_cpu_s']:.2f} |",
        f"| the next {r['batches'] - 1} | {r['rest_s']:.2f} s (longest wait "
        f"{r['longest_wait_s']:.2f} s) | {r['rest_cpu_s']:.2f} |"])


if __name__ == "__main__":
    main()
