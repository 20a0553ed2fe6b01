"""Decoding speed: our cached greedy and beam search, against recomputing the prefix at every
step and against keras-hub's GreedySampler and BeamSampler driving its cached
TransformerDecoder (benchmarks/peer.py), with and without XLA.

    python -m benchmarks.decoding [--presets tiny,base] [--batch 32] [--source_length 24]
        [--new_tokens 32] [--repeats 5] [--out benchmarks/results/decoding.json]

EOS is disabled (an id the model never produces; no stop token for the peer) and our limit
(source length + max_extra) is set to `new_tokens`, so every variant generates exactly
`new_tokens` tokens per hypothesis; the length penalty is 0 (keras-hub's BeamSampler has none).
Weights are random: speed does not depend on them.

Cache memory (ours): 2 (keys, values) x layers x batch x beam x kv_heads x new tokens x d_k
values for self-attention, plus 2 x layers x batch x beam x kv_heads x source x d_k for
encoder-decoder attention: linear in beam x length x layers.
"""

import argparse
import statistics
import time

import numpy as np
import tensorflow as tf

import keras_transformer as kt
from benchmarks import save
from keras_transformer.decoding import beam_search, greedy_search


def generated_tokens(output):
    """Tokens generated: ours return dicts of sequences (padding 0, never generated); the peer
    returns BOS and then its fixed number of steps (which may include id 0)."""
    if isinstance(output, dict):
        return int(np.count_nonzero(output["sequences"]))
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


def run(presets=("tiny",), batch=32, source_length=24, new_tokens=32, repeats=5):
    import keras_hub

    from benchmarks.peer import PeerTransformer, peer_generate

    rows = []
    for preset in presets:
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
        for library, search, mode, xla, beams, fn in variants:
            check_work(fn, batch * beams * new_tokens if library == "ours"
                       else batch * new_tokens)
        times = [[] for _ in variants]
        for _ in range(repeats):  # alternate, so drift hits every variant alike
            for variant_times, variant in zip(times, variants):
                variant_times.append(time_once(variant[-1]))
        for (library, search, mode, xla, beams, fn), variant_times in zip(variants, times):
            seconds = statistics.median(variant_times)
            rows.append({"preset": preset, "library": library, "search": search, "mode": mode,
                         "xla": xla, "seconds": seconds, "sentences_per_s": batch / seconds,
                         "tokens_per_s": batch * new_tokens / seconds,
                         "cache_mb": cache_bytes(config, batch, beams, source_length,
                                                 new_tokens) / 2**20})
            print(markdown_row(rows[-1]), flush=True)
    return rows


def markdown_row(r):
    return (f"| {r['preset']} | {r['library']} | {r['search']} | {r['mode']} | "
            f"{'on' if r['xla'] else 'off'} | {r['seconds']:.3f} | {r['sentences_per_s']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['cache_mb']:.1f} |")


def markdown(rows):
    lines = ["| preset | library | search | mode | XLA | s/batch | sentences/s | tokens/s | "
             "cache MB (ours) |", "|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [markdown_row(r) for r in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--source_length", type=int, default=24)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/decoding.json")
    args = parser.parse_args()
    rows = run(args.presets.split(","), args.batch, args.source_length, args.new_tokens,
               args.repeats)
    save(args.out, rows, markdown(rows))


if __name__ == "__main__":
    main()
