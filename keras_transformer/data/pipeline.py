"""The `tf.data` input pipeline (§5.1): tokenize in the graph, add BOS/EOS, drop pairs over
the length limit (counted), and batch pairs of similar length under a token budget.

Elements are `({"source_ids": [B, S], "target_ids": [B, T]}, labels [B, T])`, int32, padded
with 0: source = tokens + EOS, target_ids = BOS + tokens (the target shifted right),
labels = tokens + EOS.

Two batching modes:
- dynamic (GPUs, CPUs): batches padded to their own longest pair; batch size per length
  bucket = batch_tokens // bucket length, so every batch holds at most `batch_tokens` source
  and at most `batch_tokens` target positions, padding included. Nothing is dropped.
- static (TPUs, XLA): every batch padded to its bucket's length, batch sizes fixed per bucket
  and divisible by the replica count, remainders dropped: only a handful of shapes, so XLA
  compiles each once.
"""

import logging

import tensorflow as tf

from keras_transformer.config import ConfigError
from keras_transformer.tokenizer import BOS_ID, EOS_ID

logger = logging.getLogger(__name__)


def bucket_boundaries(max_length, smallest=8, growth=1.25):
    """Length buckets growing geometrically, the last one holding `max_length`: each
    boundary is an exclusive upper bound on the (source or target) length with BOS/EOS."""
    bounds, length = [], smallest
    while length <= max_length:
        bounds.append(length)
        length = max(length + 1, int(length * growth + 0.5))
        length = (length + 3) // 4 * 4  # multiples of 4 pad better on accelerators
    return bounds + [max_length + 1]


def bucket_batch_sizes(boundaries, batch_tokens, multiple=1):
    """Pairs per batch for each bucket (one more than there are boundaries, as
    `bucket_by_sequence_length` wants), each a multiple of `multiple`."""
    lengths = [b - 1 for b in boundaries] + [boundaries[-1] - 1]  # the last bucket stays empty
    sizes = [batch_tokens // length // multiple * multiple for length in lengths]
    if min(sizes) < max(multiple, 1):
        raise ConfigError(
            f"batch_tokens={batch_tokens} cannot hold {multiple} pair(s) of the maximum length "
            f"{lengths[-1]}: raise batch_tokens or lower max_length.")
    return sizes


class PipelineStats:
    """Counters the pipeline updates as it reads: pairs kept and pairs over the limit."""

    def __init__(self):
        self.kept = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.too_long = tf.Variable(0, dtype=tf.int64, trainable=False)

    def log(self):
        logger.info("input pipeline: %d pairs read and kept, %d skipped as longer than the limit",
                    int(self.kept.numpy()), int(self.too_long.numpy()))

    def as_dict(self):
        return {"kept": int(self.kept.numpy()), "too_long": int(self.too_long.numpy())}


def encode_pairs(pairs, tokenizer, max_length, stats=None):
    """(source, target) strings -> ({"source_ids", "target_ids"}, labels) 1-D rows,
    dropping (and counting) pairs whose source + EOS or target + EOS exceed `max_length`."""

    def tokenize(source, target):
        source_ids, target_ids = tokenizer.tokenize(source), tokenizer.tokenize(target)
        inputs = {"source_ids": tf.concat([source_ids, [EOS_ID]], axis=0),
                  "target_ids": tf.concat([[BOS_ID], target_ids], axis=0)}
        return inputs, tf.concat([target_ids, [EOS_ID]], axis=0)

    def fits(inputs, labels):
        ok = (tf.size(inputs["source_ids"]) <= max_length) & (tf.size(labels) <= max_length)
        if stats is not None:
            stats.kept.assign_add(tf.cast(ok, tf.int64))
            stats.too_long.assign_add(tf.cast(~ok, tf.int64))
        return ok

    return pairs.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE).filter(fits)


def make_dataset(pairs, tokenizer, *, batch_tokens=4096, max_length=128, shuffle=True, seed=0,
                 shuffle_buffer=50_000, static=False, num_replicas=1, repeat=False,
                 input_context=None, stats=None):
    """Batches of token ids from a dataset of (source, target) strings.

    Args:
        pairs: `tf.data.Dataset` of (source, target) scalar strings.
        tokenizer: a `Tokenizer` (the shared vocabulary).
        batch_tokens: the token budget of one batch, for the source and for the target alike
            (the paper: about 25,000 each, over 8 GPUs).
        max_length: the longest source or target kept, BOS/EOS included.
        shuffle, seed, shuffle_buffer: shuffle pairs before batching and batches after it,
            reshuffled every epoch, deterministically from `seed`.
        static: the TPU/XLA mode (see the module docstring).
        num_replicas: in static mode, batch sizes are multiples of it.
        input_context: a `tf.distribute.InputContext`; each worker reads its own shard.
        stats: a `PipelineStats` to count kept and over-long pairs.
    """
    if input_context is not None and input_context.num_input_pipelines > 1:
        pairs = pairs.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
        pairs = pairs.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    dataset = encode_pairs(pairs, tokenizer, max_length, stats)

    boundaries = bucket_boundaries(max_length)
    sizes = bucket_batch_sizes(boundaries, batch_tokens, num_replicas if static else 1)

    def length(inputs, labels):
        return tf.maximum(tf.size(inputs["source_ids"]), tf.size(labels))

    dataset = dataset.bucket_by_sequence_length(
        length, boundaries, sizes, pad_to_bucket_boundary=static, drop_remainder=static)
    if shuffle:
        dataset = dataset.shuffle(256, seed=seed + 1, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    return dataset.prefetch(tf.data.AUTOTUNE)


def static_shapes(max_length, batch_tokens, num_replicas=1):
    """The (batch, length) shapes static mode can produce."""
    boundaries = bucket_boundaries(max_length)
    sizes = bucket_batch_sizes(boundaries, batch_tokens, num_replicas)
    return {(size, bound - 1) for size, bound in zip(sizes, boundaries)}
