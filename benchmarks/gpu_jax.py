"""Training and beam-search speed on the JAX backend (XLA), for a GPU machine without TensorFlow.

    KERAS_BACKEND=jax python -m benchmarks.gpu_jax                  # base, mixed_bfloat16
    python -m benchmarks.gpu_jax --preset tiny --steps 4 --beam_batches 1   # a CPU smoke run

Needs only keras (and jax, numpy, h5py...), not TensorFlow: `bash benchmarks/gpu_jax.sh`
carries keras to a machine that has JAX but no package registry. Batches are synthetic: token
ids with sentence lengths drawn like WMT news (log-normal, median 24 tokens, 4 to 64), sorted
into three length buckets and packed to `--batch_tokens` target tokens per batch (padding
included), as the trainer's pipeline packs them. Reports real target tokens per second of
`model.fit` (the training step users run, label-smoothed loss, Adam, the schedule) and
sentences per second of `beam_search` (beam 4, alpha 0.6, max_extra 50), each after its shapes
are compiled; writes them as JSON to `--out`.
"""

import argparse
import json
import os
import platform
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402

BUCKETS = (24, 40, 64)  # padded widths: few shapes, so compiling stays a small part of the run


def sentence_lengths(rng, n):
    """n sentence lengths in tokens (EOS included), log-normal like WMT news, 4 to 64."""
    return np.clip(np.round(rng.lognormal(np.log(24), 0.5, n)), 4, BUCKETS[-1]).astype(int)


def synthetic_batches(rng, vocab_size, batch_tokens, count):
    """`count` (inputs, labels) batches per bucket width: each row a sentence pair of
    similar lengths, padded to the bucket; rows per batch = batch_tokens // width."""
    batches, real = [], []
    for shorter, width in zip((0,) + BUCKETS, BUCKETS):
        rows = batch_tokens // width
        for _ in range(count):
            lengths = sentence_lengths(rng, 8 * rows)
            lengths = np.resize(lengths[(lengths > shorter) & (lengths <= width)], rows)
            source = np.zeros((rows, width), np.int32)
            target = np.zeros((rows, width), np.int32)
            labels = np.zeros((rows, width), np.int32)
            for i, n in enumerate(lengths):
                m = int(np.clip(n + rng.integers(-3, 4), 2, width))
                source[i, :m] = rng.integers(4, vocab_size, m)
                sentence = rng.integers(4, vocab_size, n)
                target[i, 0], target[i, 1:n] = kt.config.BOS_ID, sentence[:-1]
                labels[i, :n - 1], labels[i, n - 1] = sentence[:-1], kt.config.EOS_ID
            batches.append(({"source_ids": source, "target_ids": target}, labels))
            real.append(int((labels != 0).sum()))
    return batches, real


def device_description():
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})"


def train_speed(config, precision, batches, real, steps):
    """Real target tokens per second of `model.fit`, timed over `steps` batches after one
    pass over every shape (compilation)."""
    keras.mixed_precision.set_global_policy(precision)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.make_optimizer(kt.TransformerSchedule(config.d_model)),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=config.pad_id))
    warm = len(batches)
    order = [i % len(batches) for i in range(warm + steps)]
    times = []

    def timed():
        for i in order:
            yield batches[i]

    clock = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: times.append(time.perf_counter()))
    began = time.perf_counter()
    history = model.fit(timed(), steps_per_epoch=len(order), epochs=1, verbose=0,
                        callbacks=[clock])
    compile_s = times[warm - 1] - began
    seconds = times[-1] - times[warm - 1]
    tokens = sum(real[i] for i in order[warm:])
    return model, {"real_target_tokens_per_s": tokens / seconds, "timed_steps": steps,
                   "compile_and_first_pass_s": compile_s,
                   "final_loss": float(history.history["loss"][-1])}


def beam_speed(model, rng, vocab_size, sentences, batches):
    """Sentences per second of beam search (beam 4, alpha 0.6), after compiling."""
    width = BUCKETS[1]
    sources = []
    for _ in range(batches + 1):
        ids = np.zeros((sentences, width), np.int32)
        for row, n in enumerate(sentence_lengths(rng, sentences)):
            n = min(n, width)
            ids[row, :n - 1], ids[row, n - 1] = rng.integers(4, vocab_size, n - 1), kt.config.EOS_ID
        sources.append(ids)
    settings = dict(bos_id=kt.config.BOS_ID, eos_id=kt.config.EOS_ID, beam_size=4, alpha=0.6,
                    max_extra=50)
    began = time.perf_counter()
    keras.ops.convert_to_numpy(kt.beam_search(model, sources[0], **settings)["sequences"])
    compile_s = time.perf_counter() - began
    began = time.perf_counter()
    for ids in sources[1:]:
        keras.ops.convert_to_numpy(kt.beam_search(model, ids, **settings)["sequences"])
    seconds = time.perf_counter() - began
    return {"sentences_per_s": sentences * batches / seconds, "batch_sentences": sentences,
            "compile_and_first_batch_s": compile_s}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", help="TransformerConfig preset")
    parser.add_argument("--precision", default="mixed_bfloat16",
                        help="Keras dtype policy: mixed_bfloat16 or float32")
    parser.add_argument("--batch_tokens", type=int, default=25_000,
                        help="target tokens per batch, padding included (the paper: ~25,000)")
    parser.add_argument("--vocab_size", type=int, default=32_000)
    parser.add_argument("--steps", type=int, default=40, help="timed training steps")
    parser.add_argument("--beam_sentences", type=int, default=256, help="sentences per batch")
    parser.add_argument("--beam_batches", type=int, default=4, help="timed beam batches")
    parser.add_argument("--out", default="benchmarks/results/gpu_jax.json")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax":
        parser.error(f"KERAS_BACKEND is {keras.backend.backend()!r}: this benchmark is for jax")

    rng = np.random.default_rng(0)
    config = kt.TransformerConfig.preset(args.preset, vocab_size=args.vocab_size, dropout=0.1)
    batches, real = synthetic_batches(rng, args.vocab_size, args.batch_tokens, 2)
    model, training = train_speed(config, args.precision, batches, real, args.steps)
    decoding = beam_speed(model, rng, args.vocab_size, args.beam_sentences, args.beam_batches)
    result = {"device": device_description(), "host": platform.processor() or platform.machine(),
              "keras": keras.__version__, "backend": "jax", "preset": args.preset,
              "precision": args.precision, "batch_tokens": args.batch_tokens,
              "vocab_size": args.vocab_size,
              "real_share_of_batch": sum(real) / (len(real) * args.batch_tokens),
              "training": training, "beam_search": decoding}
    print(json.dumps(result, indent=2))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
