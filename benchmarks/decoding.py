"""Decoding speed: our cached greedy and beam search, against recomputing the prefix at every
step, against keras-hub's GreedySampler and BeamSampler driving its cached
TransformerDecoder (benchmarks/peer.py), with and without XLA, and against CTranslate2 (float32
and int8, the same weights converted by export/ctranslate2.py): the CPU decoding limit we
measure ourselves against (the last column: sentences/s as a multiple of CTranslate2 float32's).

    python -m benchmarks.decoding [--presets tiny,base] [--batches 32,1] [--source_length 24]
        [--new_tokens 32] [--repeats 5] [--out benchmarks/results/decoding.json]

EOS is disabled (an id the model never produces; no stop token for the peer) and our limit
(source length + max_extra) is set to `new_tokens`, so every variant generates exactly
`new_tokens` tokens per hypothesis (CTranslate2: minimum and maximum decoding length both
`new_tokens`); the length penalty is 0 (keras-hub's BeamSampler has none).
Weights are random: speed does not depend on them.

Cache memory (ours): 2 (keys, values) x layers x batch x beam x kv_heads x new tokens x d_k
values for self-attention, plus 2 x layers x batch x beam x kv_heads x source x d_k for
encoder-decoder attention: linear in beam x length x layers.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

import keras_transformer as kt
from benchmarks import save
from keras_transformer.decoding import beam_search, greedy_search


# CTranslate2's OpenMP threads spin for a while after each call (Intel OpenMP: 200 ms): the
# next variant waits that long untimed instead of sharing the cores with them.
OPENMP_SPIN_SECONDS = 0.3


def generated_tokens(output):
    """Tokens generated: ours return dicts of sequences (padding 0, never generated); the peer
    returns BOS and then its fixed number of steps (which may include id 0); CTranslate2 a
    list of results, the best hypothesis of each counted."""
    if isinstance(output, dict):
        return int(np.count_nonzero(output["sequences"]))
    if isinstance(output, list):
        return sum(len(result.hypotheses[0]) for result in output)
    return output.shape[0] * (output.shape[1] - 1)


def check_work(fn, expected_tokens):
    """Runs `fn` once (tracing and, with XLA, compiling) and checks it did the fixed work."""
    tokens = generated_tokens(fn())
    if tokens != expected_tokens:
        raise AssertionError(f"generated {tokens} tokens, not {expected_tokens}: unequal work")


def time_once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cache_bytes(config, batch, beams, source_length, new_tokens, bytes_per_value=4):
    kv_heads = config.num_kv_heads or config.num_heads
    head_dim = config.key_dim or config.d_model // config.num_heads
    per_position = 2 * config.num_layers * batch * beams * kv_heads * head_dim
    return per_position * (new_tokens + source_length) * bytes_per_value


def ctranslate2_variants(model, source, new_tokens, folder):
    """CTranslate2 translators (float32, int8) of `model`'s weights, as benchmark variants:
    (name, beams, function) each generating exactly `new_tokens` tokens per hypothesis."""
    import types

    import ctranslate2

    from export.ctranslate2 import transformer_spec

    pieces = ["<pad>", "<s>", "</s>", "<unk>"] + [f"p{i}" for i in range(4, model.config.vocab_size)]
    vocabulary = types.SimpleNamespace(pieces=lambda: pieces, pad_id=0, bos_id=1, eos_id=2,
                                       unk_id=3)
    spec = transformer_spec(model, vocabulary)
    spec.validate()
    spec.optimize()
    spec.save(folder)
    tokens = [[pieces[i] for i in row[:-1]] for row in source.numpy()]  # CTranslate2 adds EOS
    variants = []
    for compute_type in ("float32", "int8"):
        translator = ctranslate2.Translator(folder, device="cpu", compute_type=compute_type,
                                            intra_threads=os.cpu_count())
        for beams in (1, 4):
            fn = lambda t=translator, b=beams: t.translate_batch(  # noqa: E731
                tokens, beam_size=b, length_penalty=0.0, min_decoding_length=new_tokens,
                max_decoding_length=new_tokens, max_input_length=0)
            variants.append((compute_type, beams, fn))
    return variants


def run(presets=("tiny",), batches=(32,), source_length=24, new_tokens=32, repeats=5):
    rows = []
    for preset in presets:
        for batch in batches:
            rows += run_one(preset, batch, source_length, new_tokens, repeats)
    return rows


def run_one(preset, batch, source_length, new_tokens, repeats):
    import keras_hub

    from benchmarks.peer import PeerTransformer, peer_generate

    rows = []
    vocab = 8000 if preset == "tiny" else 32000
    config = kt.TransformerConfig.preset(preset, vocab_size=vocab,
                                         max_length=source_length + new_tokens + 8)
    ours = kt.Transformer(config)
    ours.build()
    peer = PeerTransformer(config)
    rng = np.random.default_rng(0)
    source = tf.constant(rng.integers(3, config.vocab_size, (batch, source_length)),
                         tf.int32)
    peer({"source_ids": source, "target_ids": source})
    # Our limit is source length + max_extra: exactly `new_tokens` for every source.
    settings = dict(bos_id=1, eos_id=-1, max_extra=new_tokens - source_length)
    variants = []
    for xla in (False, True):
        for beams in (1, 4):
            search = "greedy" if beams == 1 else "beam 4"
            modes = ["cached"] + (["recompute prefix"] if not xla else [])
            for mode in modes:
                use_cache = mode == "cached"
                if beams == 1:
                    fn = lambda u=use_cache, x=xla: greedy_search(  # noqa: E731
                        ours, source, use_cache=u, jit_compile=x, **settings)
                else:
                    fn = lambda u=use_cache, x=xla: beam_search(  # noqa: E731
                        ours, source, beam_size=4, alpha=0.0, use_cache=u, jit_compile=x,
                        **settings)
                variants.append(("ours", search, mode, xla, beams, fn))
            sampler = (keras_hub.samplers.GreedySampler() if beams == 1
                       else keras_hub.samplers.BeamSampler(num_beams=4))
            peer_fn = tf.function(lambda s, sm=sampler: peer_generate(peer, s, new_tokens, sm),
                                  jit_compile=xla)
            variants.append(("keras-hub", search, "cached", xla, beams,
                             lambda f=peer_fn: f(source)))
    folder = tempfile.mkdtemp(prefix="ct2-benchmark-")
    for compute_type, beams, fn in ctranslate2_variants(ours, source, new_tokens, folder):
        variants.append(("CTranslate2", "greedy" if beams == 1 else "beam 4", compute_type,
                         False, beams, fn))
    for library, search, mode, xla, beams, fn in variants:
        check_work(fn, batch * beams * new_tokens if library == "ours"
                   else batch * new_tokens)
    times = [[] for _ in variants]
    for _ in range(repeats):  # alternate, so drift hits every variant alike
        for variant_times, variant in zip(times, variants):
            variant_times.append(time_once(variant[-1]))
            if variant[0] == "CTranslate2":
                time.sleep(OPENMP_SPIN_SECONDS)
    for (library, search, mode, xla, beams, fn), variant_times in zip(variants, times):
        seconds = statistics.median(variant_times)
        rows.append({"preset": preset, "batch": batch, "library": library, "search": search,
                     "mode": mode, "xla": xla, "seconds": seconds,
                     "sentences_per_s": batch / seconds,
                     "tokens_per_s": batch * new_tokens / seconds,
                     "cache_mb": cache_bytes(config, batch, beams, source_length,
                                             new_tokens) / 2**20})
    for row in rows:  # as a multiple of CTranslate2 float32 on the same search
        limit = next(r for r in rows if r["library"] == "CTranslate2"
                     and r["mode"] == "float32" and r["search"] == row["search"])
        row["vs_ctranslate2"] = row["sentences_per_s"] / limit["sentences_per_s"]
        print(markdown_row(row), flush=True)
    return rows


def markdown_row(r):
    return (f"| {r['preset']} | {r['batch']} | {r['library']} | {r['search']} | {r['mode']} | "
            f"{'on' if r['xla'] else 'off'} | {r['seconds']:.3f} | {r['sentences_per_s']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['cache_mb']:.1f} | {r['vs_ctranslate2']:.2f} |")


def markdown(rows):
    lines = ["| preset | batch | library | search | mode | XLA | s/batch | sentences/s | "
             "tokens/s | cache MB (ours) | x CTranslate2 fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [markdown_row(r) for r in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--batches", default="32,1")
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/decoding.json")
    args = parser.parse_args()
    from benchmarks.end_to_end import hardware

    machine = hardware()
    rows = run(args.presets.split(","), [int(b) for b in args.batches.split(",")],
               args.source_length, args.new_tokens, args.repeats)
    header = (f"{machine['cpu']}, {machine['cores']} cores, flags {' '.join(machine['flags'])}; "
              f"float32 matmul peak {machine['matmul_peak_gflops_float32']:.0f} GFLOP/s; "
              f"TensorFlow {machine['tensorflow']}; source {args.source_length} tokens, "
              f"{args.new_tokens} generated, median of {args.repeats}\n\n")
    save(args.out, {"hardware": machine, "rows": rows}, header + markdown(rows))


if __name__ == "__main__":
    main()
