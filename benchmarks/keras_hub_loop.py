"""The plain keras-hub training loop the end-to-end benchmark compares the trainer with: what a
keras-hub user writes in an afternoon.

The same corpus and SentencePiece vocabulary as the trainer, tokenized up front; pairs sorted
by length and packed into batches under the same token budget (batch x longest source and batch
x longest target within it), batch order shuffled each epoch; keras-hub's `TransformerEncoder`,
`TransformerDecoder`, `ReversibleEmbedding` and `SinePositionEncoding` at the trainer's
dimensions (benchmarks/peer.py); stock `keras.optimizers.Adam` (beta2 0.98, epsilon 1e-9) with
the §5.3 schedule; Keras' `categorical_crossentropy` with label smoothing 0.1 (§5.4) on one-hot
labels, masked to the real target tokens; `model.fit` for a wall-clock budget; greedy decoding
with keras-hub's `GreedySampler` at the end, its first hypotheses printed beside the references.

    python -m benchmarks.keras_hub_loop --vocab vocab.model --minutes 5 --out peer.json \
        [--train_files train.tsv | train.en.gz train.de.gz] [--test_files ...] [--preset tiny]
        [--batch_tokens 2048]
"""

import argparse
import gzip
import json
import math
import pathlib
import random
import time


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in f]


def read_pairs(split, files):
    """(source, target) pairs: one TSV, two aligned files (plain or .gz), or the sample
    corpus's `split`. Blank pairs are left out, as the trainer leaves them out."""
    if not files:
        from keras_transformer.data import sample_corpus

        return sample_corpus.sample_pairs(split)
    if len(files) == 2:
        pairs = list(zip(read_lines(files[0]), read_lines(files[1])))
    else:
        pairs = [tuple(line.split("\t")) for line in read_lines(files[0]) if line.count("\t") == 1]
    return [(s.strip(), t.strip()) for s, t in pairs if s.strip() and t.strip()]


def tokenize(tokenizer, texts, chunk=4096):
    ids = []
    for start in range(0, len(texts), chunk):
        rows = tokenizer(texts[start:start + chunk])
        ids += [list(row) for row in (rows.to_list() if hasattr(rows, "to_list") else rows)]
    return ids


def pack(pairs, batch_tokens):
    """Length-sorted (source, BOS + target + EOS) pairs cut into batches of at most
    `batch_tokens` padded tokens a side (the model sees the target one shorter)."""
    def lengths(pair):
        return len(pair[0]), len(pair[1]) - 1

    batches, batch, longest = [], [], 0
    for pair in sorted(pairs, key=lambda p: lengths(p)[::-1]):
        length = max(longest, *lengths(pair))
        if batch and (len(batch) + 1) * length > batch_tokens:
            batches.append(batch)
            batch, length = [], max(lengths(pair))
        batch.append(pair)
        longest = length
    return batches + [batch] if batch else batches


def to_arrays(batch):
    import numpy as np

    source = np.zeros((len(batch), max(len(s) for s, _ in batch)), np.int32)
    target = np.zeros((len(batch), max(len(t) for _, t in batch)), np.int32)
    for row, (s, t) in enumerate(batch):
        source[row, :len(s)], target[row, :len(t)] = s, t
    return {"source_ids": source, "target_ids": target[:, :-1]}, target[:, 1:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", required=True, help="the trainer's SentencePiece model")
    parser.add_argument("--train_files", nargs="+", default=None,
                        help="a TSV or two aligned files (default: the sample corpus)")
    parser.add_argument("--test_files", nargs="+", default=None,
                        help="a TSV or two aligned files (default: the sample corpus)")
    parser.add_argument("--label_smoothing", type=float, default=0.1, help="§5.4 (0: none)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch_tokens", type=int, default=2048)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--warmup_steps", type=int, default=200)
    parser.add_argument("--lr_scale", type=float, default=0.5)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--eval_sentences", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import keras
    import keras_hub
    import numpy as np
    import sacrebleu
    import tensorflow as tf

    import keras_transformer as kt
    from benchmarks.peer import PeerTransformer, peer_generate
    from trainers.callbacks import usable_cores

    keras.utils.set_random_seed(args.seed)
    keras.mixed_precision.set_global_policy(args.precision)
    proto = pathlib.Path(args.vocab).read_bytes()
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=proto)
    bos, eos = 1, 2

    train = read_pairs("train", args.train_files)
    sources, targets = tokenize(tokenizer, [s for s, _ in train]), tokenize(tokenizer, [t for _, t in train])
    pairs = [(s + [eos], [bos] + t + [eos]) for s, t in zip(sources, targets)
             if len(s) + 1 <= args.max_length and len(t) + 1 <= args.max_length]
    batches = pack(pairs, args.batch_tokens)
    real_tokens = [sum(len(t) - 1 for _, t in batch) for batch in batches]
    order_log = []

    def generate():
        rng = random.Random(args.seed)
        while True:
            order = list(range(len(batches)))
            rng.shuffle(order)
            for index in order:
                order_log.append(index)
                yield to_arrays(batches[index])

    spec = ({"source_ids": tf.TensorSpec([None, None], tf.int32),
             "target_ids": tf.TensorSpec([None, None], tf.int32)},
            tf.TensorSpec([None, None], tf.int32))
    dataset = tf.data.Dataset.from_generator(generate, output_signature=spec).prefetch(2)

    config = kt.TransformerConfig.preset(args.preset, vocab_size=tokenizer.vocabulary_size(),
                                         max_length=args.max_length)
    model = PeerTransformer(config)
    schedule = kt.TransformerSchedule(config.d_model, args.warmup_steps, args.lr_scale)
    vocab_size = config.vocab_size

    def smoothed_loss(labels, logits):
        """Keras' label-smoothed categorical cross-entropy on one-hot labels, averaged over
        the real (non-padding) target tokens: what a keras-hub user writes for §5.4."""
        real = keras.ops.cast(labels != 0, "float32")
        per_token = keras.losses.categorical_crossentropy(
            keras.ops.one_hot(labels, vocab_size), logits, from_logits=True,
            label_smoothing=args.label_smoothing)
        return keras.ops.sum(per_token * real) / keras.ops.maximum(keras.ops.sum(real), 1.0)

    model.compile(optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss=smoothed_loss)

    class Clock(keras.callbacks.Callback):
        """Stops after the budget; times from the end of the first step (tracing excluded)."""

        def on_train_begin(self, logs=None):
            self.start, self.steps, self.losses = time.monotonic(), 0, []

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == 1:
                self.first_end, self.first_cpu = time.monotonic(), time.process_time()
            self.losses.append(float(logs["loss"]))
            if time.monotonic() - self.start >= 60 * args.minutes:
                self.model.stop_training = True

    clock = Clock()
    model.fit(dataset, epochs=10**6, steps_per_epoch=100, verbose=0, callbacks=[clock])
    seconds = time.monotonic() - clock.first_end
    cpu_seconds = time.process_time() - clock.first_cpu  # all threads, as the trainer counts
    trained = [real_tokens[i] for i in order_log[:clock.steps]]

    test = read_pairs("test", args.test_files)[:args.eval_sentences]
    test_ids = tokenize(tokenizer, [s for s, _ in test])
    # Compiled, as keras-hub's generate() compiles its loop (eagerly, its while_loop runs op
    # by op in Python); sources sorted by length and padded to a multiple of 8, so that few
    # shapes are traced.
    sampler = keras_hub.samplers.GreedySampler()
    generate = tf.function(lambda source, new_tokens: peer_generate(model, source, new_tokens,
                                                                    sampler))
    order = sorted(range(len(test)), key=lambda i: len(test_ids[i]))
    hypotheses = [None] * len(test)
    for start in range(0, len(test), 64):
        chosen = order[start:start + 64]
        rows = [test_ids[i][:args.max_length - 1] + [eos] for i in chosen]
        width = min(-(-max(map(len, rows)) // 8) * 8, args.max_length)
        source = np.zeros((len(rows), width), np.int32)
        for r, ids in enumerate(rows):
            source[r, :len(ids)] = ids
        out = generate(tf.constant(source), min(args.max_length, width + 50)).numpy()
        for i, row in zip(chosen, out[:, 1:]):
            row = list(row)
            row = row[:row.index(eos)] if eos in row else row
            text = tokenizer.detokenize([[int(t) for t in row if t > 2]])
            text = text[0] if isinstance(text, list) else text.numpy()[0]
            hypotheses[i] = text.decode("utf-8") if isinstance(text, bytes) else str(text)
    bleu = sacrebleu.corpus_bleu(hypotheses, [[t for _, t in test]]).score
    for (source, reference), hypothesis in list(zip(test, hypotheses))[:5]:  # is it translating?
        print(f"source:     {source}\nreference:  {reference}\nhypothesis: {hypothesis}\n",
              flush=True)
    report = {"steps": clock.steps, "train_seconds": seconds + (clock.first_end - clock.start),
              "target_tokens": sum(trained),
              "target_tokens_per_s": sum(trained[1:]) / max(seconds, 1e-9),
              "real_token_share": sum(trained) / (len(trained) * args.batch_tokens),
              "cpu_use": cpu_seconds / max(seconds * usable_cores(), 1e-9),
              "final_loss": float(np.mean(clock.losses[-100:])), "greedy_bleu": bleu,
              "eval_sentences": len(test)}
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0 if math.isfinite(report["final_loss"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
