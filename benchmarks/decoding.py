"""Decoding speed: cached incremental decoding against recomputing the prefix at every step.

    python -m benchmarks.decoding [--preset tiny] [--batch 32] [--source_length 24]
        [--new_tokens 32] [--repeats 3] [--out benchmarks/results/decoding.json]

EOS is disabled (an id the model never produces) so every variant generates exactly
`new_tokens` tokens per hypothesis. Weights are random: speed does not depend on them.
"""

import argparse
import json
import pathlib
import statistics
import time

import numpy as np
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.decoding import beam_search, greedy_search


def time_call(fn, repeats):
    fn()  # warm-up: tracing and, with XLA, compilation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(preset="tiny", batch=32, source_length=24, new_tokens=32, repeats=3, variants=None):
    config = kt.TransformerConfig.preset(preset, max_length=source_length + new_tokens + 8)
    model = kt.Transformer(config)
    model.build()
    rng = np.random.default_rng(0)
    source = tf.constant(rng.integers(3, config.vocab_size, (batch, source_length)), tf.int32)
    settings = dict(bos_id=1, eos_id=-1, max_extra=new_tokens)
    variants = variants or [
        ("greedy", "cached", False), ("greedy", "recompute prefix", False),
        ("beam 4", "cached", False), ("beam 4", "recompute prefix", False),
        ("greedy", "cached", True), ("beam 4", "cached", True),
    ]
    rows = []
    for search, mode, xla in variants:
        use_cache = mode == "cached"
        if search == "greedy":
            fn = lambda: greedy_search(model, source, use_cache=use_cache,  # noqa: E731
                                       jit_compile=xla, **settings)
        else:
            fn = lambda: beam_search(model, source, beam_size=4, alpha=0.6,  # noqa: E731
                                     use_cache=use_cache, jit_compile=xla, **settings)
        seconds = time_call(fn, repeats)
        beams = 1 if search == "greedy" else 4
        rows.append({"preset": preset, "search": search, "mode": mode, "xla": xla,
                     "seconds": seconds, "sentences_per_s": batch / seconds,
                     "tokens_per_s": batch * new_tokens / seconds,
                     "hypothesis_tokens_per_s": batch * beams * new_tokens / seconds})
    return rows


def markdown(rows):
    lines = ["| preset | search | mode | XLA | s/batch | sentences/s | tokens/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['search']} | {r['mode']} | {'on' if r['xla'] else 'off'}"
                     f" | {r['seconds']:.3f} | {r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/decoding.json")
    args = parser.parse_args()
    rows = run(args.preset, args.batch, args.source_length, args.new_tokens, args.repeats)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    out.with_suffix(".md").write_text(markdown(rows) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
