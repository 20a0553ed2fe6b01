"""The `tf.data` input pipeline (§5.1): tokenize in the graph, add BOS/EOS, drop pairs over
the length limit (counted), and batch pairs of similar length under a token budget.

Elements are `({"source_ids": [B, S], "target_ids": [B, T]}, labels [B, T])`, int32, padded
with `pad_id` (0): source = tokens + EOS, target_ids = BOS + tokens (the target shifted right),
labels = tokens + EOS.

Batching modes:
- dynamic "packed" (GPUs, CPUs), the default: pairs are read in windows of `window` pairs,
  each window is sorted by target length and cut greedily into batches as large as the
  budget allows: B x longest target <= batch_tokens, B x longest source <= source_tokens
  (fairseq's and OpenNMT-tf's "sort within a window and fill to the budget"). Batches are
  padded to their own longest pair, so nearly the whole target budget is real tokens (far
  more than with length buckets); they are shuffled afterwards. Ties in target length are
  sorted by source length (turning at each target length), so a batch's sources are alike
  too. Nothing is dropped.
- dynamic "mixed": the window is cut in its shuffled order instead: batches of mixed
  lengths, with padding. On the sample corpus, whose sentence templates are nearly fixed by
  their length, batches of one length learn markedly slower per step (hence "concat" for
  it); natural corpora train sorted, as fairseq and OpenNMT-tf do.
- concat (`batching="concat"`): several pairs share each row of `row_length` tokens (first
  fit, in the shuffled order), told apart by segment ids and positions that restart at 0 in
  every pair; the model masks attention so that each pair is computed as if alone (the
  "packed" examples of tensor2tensor). Rows are nearly full and each batch still mixes
  lengths and templates; batches are [budget //
  row_length, row_length]. Elements then add "source_segment_ids", "target_segment_ids",
  "source_positions" and "target_positions" to the inputs.
- static (TPUs, XLA): every batch padded to its length bucket's bound, batch sizes fixed per
  bucket and divisible by the replica count, remainders dropped: only a handful of shapes, so
  XLA compiles each once.

The functions handed to tf.data are traced without autograph (`do_not_convert`): their loops
and branches are TensorFlow's own (`tf.while_loop`, `tf.scan`, `tf.where`), and converting
them only cost every process about 1.5 s before its first batch.
"""

import logging

import tensorflow as tf

from keras_transformer.config import BATCHING, ConfigError
from keras_transformer.tokenizer import BOS_ID, EOS_ID

logger = logging.getLogger(__name__)
SHUFFLED_BLOCKS = 1024  # the elements a large pair shuffle buffer holds (see shuffled_pairs)


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
        """Logs the counts."""
        logger.info("input pipeline: %d pairs read and kept, %d skipped as longer than the limit",
                    int(self.kept.numpy()), int(self.too_long.numpy()))

    def as_dict(self):
        """{"kept": n, "too_long": n} as Python ints."""
        return {"kept": int(self.kept.numpy()), "too_long": int(self.too_long.numpy())}


def encode_pairs(pairs, tokenizer, max_length, window, stats=None):
    """(source, target) strings -> windows of up to `window` encoded pairs, in their order:
    ({"source_ids", "target_ids"}, labels), each a tf.RaggedTensor [n, None], dropping (and
    counting) pairs whose source + EOS or target + EOS exceed `max_length`. A window is
    tokenized in one call: per pair, tf.data's overhead cost more than the tokenizer."""

    @tf.autograph.experimental.do_not_convert
    def encode(sources, targets):
        source_ids, target_ids = tokenizer.tokenize(sources), tokenizer.tokenize(targets)
        column = tf.ones_like(source_ids.row_lengths(), tf.int32)[:, None]
        eos = tf.RaggedTensor.from_tensor(column * EOS_ID)
        inputs = {"source_ids": tf.concat([source_ids, eos], axis=1),
                  "target_ids": tf.concat([tf.RaggedTensor.from_tensor(column * BOS_ID),
                                           target_ids], axis=1)}
        labels = tf.concat([target_ids, eos], axis=1)
        fits = ((inputs["source_ids"].row_lengths() <= max_length)
                & (labels.row_lengths() <= max_length))
        if stats is not None:
            kept = tf.reduce_sum(tf.cast(fits, tf.int64))
            stats.kept.assign_add(kept)
            stats.too_long.assign_add(tf.size(fits, tf.int64) - kept)
        return ({name: tf.ragged.boolean_mask(ids, fits) for name, ids in inputs.items()},
                tf.ragged.boolean_mask(labels, fits))

    return pairs.batch(window).map(encode, num_parallel_calls=tf.data.AUTOTUNE)


def pack_sorted(source_lengths, target_lengths, batch_tokens, source_tokens=None, sort=True):
    """Cuts a window of pairs into batches that fill the target budget.

    Sorts the pairs by target length, then source length, rising for even target lengths and
    falling for odd ones (`sort=False` keeps the shuffled order, for batches of mixed
    lengths), and walks them in that order, starting a new batch
    whenever one more pair would take B x longest target over `batch_tokens` or B x longest
    source over `source_tokens` (default `batch_tokens`). Returns a `tf.RaggedTensor`
    [batches, None] of indices into the window, one row per batch.
    """
    source_tokens = source_tokens or batch_tokens
    source_lengths = tf.cast(source_lengths, tf.int32)
    target_lengths = tf.cast(target_lengths, tf.int32)
    # By target length, then source length: a batch of one target length then holds sources
    # of similar lengths too, so its longest source neither pads the rest nor cuts the batch
    # short of the target budget. The source order turns at each target length, so that a
    # batch across two lengths joins the longest sources of one to the longest of the next,
    # not to the shortest, which its longest source would pad.
    longest = tf.reduce_max(source_lengths)
    key = target_lengths * (longest + 1) + tf.where(target_lengths % 2 == 0, source_lengths,
                                                    longest - source_lengths)
    order = tf.argsort(key if sort else tf.zeros_like(target_lengths), stable=True)

    def add(state, lengths):
        batch, count, longest_source, longest_target = state
        source, target = lengths
        longest_source = tf.maximum(longest_source, source)
        longest_target = tf.maximum(longest_target, target)
        fits = ((count + 1) * longest_target <= batch_tokens) & (
            (count + 1) * longest_source <= source_tokens)
        return (tf.where(fits, batch, batch + 1), tf.where(fits, count + 1, 1),
                tf.where(fits, longest_source, source), tf.where(fits, longest_target, target))

    zero = tf.constant(0, tf.int32)
    batch_ids = tf.scan(add, (tf.gather(source_lengths, order), tf.gather(target_lengths, order)),
                        initializer=(zero, zero, zero, zero))[0]
    return tf.RaggedTensor.from_value_rowids(order, batch_ids)


def _packed_batches(batch_tokens, source_tokens, pad_id, sort):
    """A `flat_map` function: one window of ragged rows -> its packed, padded batches."""

    @tf.autograph.experimental.do_not_convert
    def batches(inputs, labels):
        groups = pack_sorted(inputs["source_ids"].row_lengths(), labels.row_lengths(),
                             batch_tokens, source_tokens, sort)

        @tf.autograph.experimental.do_not_convert
        def gather(rows):
            def take(ragged):
                return tf.gather(ragged, rows).to_tensor(default_value=pad_id)

            return ({"source_ids": take(inputs["source_ids"]),
                     "target_ids": take(inputs["target_ids"])}, take(labels))

        return tf.data.Dataset.from_tensor_slices(groups).map(gather)

    return batches


def concat_rows(source_lengths, target_lengths, row_length):
    """Places a window of pairs in rows of `row_length` source and `row_length` target
    tokens, first fit in the window's (shuffled) order: each pair goes to the first row that
    still has room for both its sides. Returns the row of each pair [n] and the row count."""
    source_lengths = tf.cast(source_lengths, tf.int32)
    target_lengths = tf.cast(target_lengths, tf.int32)
    count = tf.size(source_lengths)
    slots = tf.range(count)

    def place(i, free_source, free_target, rows, row_of):
        fits = ((free_source >= source_lengths[i]) & (free_target >= target_lengths[i])
                & (slots <= rows))  # slot `rows` is a new, empty row
        row = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        here = tf.equal(slots, row)
        return (i + 1, tf.where(here, free_source - source_lengths[i], free_source),
                tf.where(here, free_target - target_lengths[i], free_target),
                tf.maximum(rows, row + 1), tf.tensor_scatter_nd_update(row_of, [[i]], [row]))

    full = tf.fill([count], tf.constant(row_length, tf.int32))
    _, _, _, rows, row_of = tf.while_loop(
        lambda i, *_: i < count, place,
        (tf.constant(0), full, full, tf.constant(0), tf.zeros([count], tf.int32)))
    return row_of, rows


def _concatenated_rows(row_length, pad_id):
    """A `flat_map` function: one window of ragged rows -> rows of `row_length` tokens, each
    holding several pairs with their segment ids (1, 2, ... per pair; 0 for padding) and
    positions (from 0 in each pair)."""

    @tf.autograph.experimental.do_not_convert
    def rows_of(inputs, labels):
        row_of, rows = concat_rows(inputs["source_ids"].row_lengths(), labels.row_lengths(),
                                   row_length)
        order = tf.argsort(row_of, stable=True)
        pair_rows = tf.gather(row_of, order)
        first = tf.math.unsorted_segment_min(tf.range(tf.size(order)), pair_rows, rows)
        segment = tf.range(tf.size(order)) - tf.gather(first, pair_rows) + 1

        def side(*raggeds):
            """Pairs of one side (raggeds of equal row lengths) laid out in their rows:
            [rows, row_length] ids for each ragged, then segment ids and positions."""
            pairs = [tf.gather(ragged, order) for ragged in raggeds]
            pair_of_token = pairs[0].value_rowids()
            token_rows = tf.gather(pair_rows, pair_of_token)

            def laid_out(values, fill):
                tokens = tf.RaggedTensor.from_value_rowids(values, token_rows, nrows=rows)
                return tokens.to_tensor(fill, shape=[None, row_length])

            return ([laid_out(p.values, pad_id) for p in pairs]
                    + [laid_out(tf.gather(segment, pair_of_token), 0),
                       laid_out(tf.ragged.range(pairs[0].row_lengths()).values, 0)])

        source_ids, source_segments, source_positions = side(inputs["source_ids"])
        target_ids, labels, target_segments, target_positions = side(inputs["target_ids"], labels)
        return tf.data.Dataset.from_tensor_slices((
            {"source_ids": source_ids, "target_ids": target_ids,
             "source_segment_ids": source_segments, "target_segment_ids": target_segments,
             "source_positions": source_positions, "target_positions": target_positions},
            labels))

    return rows_of


def make_dataset(pairs, tokenizer, *, batch_tokens=4096, max_length=128, shuffle=True, seed=0,
                 shuffle_buffer=50_000, static=False, num_replicas=1, repeat=False,
                 input_context=None, stats=None, window=None, source_tokens=None, pad_id=0,
                 batching="packed", row_length=None, keep_remainder=False):
    """Batches of token ids from a dataset of (source, target) strings.

    Args:
        pairs: `tf.data.Dataset` of (source, target) scalar strings.
        tokenizer: a `Tokenizer` (the shared vocabulary).
        batch_tokens: the token budget of one batch: target positions, padding included (the
            paper: about 25,000 source and 25,000 target tokens, over 8 GPUs).
        source_tokens: the budget of the padded source side in dynamic mode (default 1.5 x
            batch_tokens: a batch mixes source lengths, and its longest source, not its real
            source tokens, counts). Static mode holds both sides to `batch_tokens`.
        max_length: the longest source or target kept, BOS/EOS included.
        shuffle, seed, shuffle_buffer: shuffle pairs before batching and batches after it,
            reshuffled every epoch, deterministically from `seed`.
        static: the TPU/XLA mode (see the module docstring); with "concat", every batch is
            [rows, row_length] with rows a multiple of `num_replicas`.
        num_replicas: in static mode, batch sizes are multiples of it.
        repeat: repeat forever; pairs are repeated before batching, so no epoch ends on a
            part-filled batch.
        input_context: a `tf.distribute.InputContext`; each worker reads its own shard.
        stats: a `PipelineStats` to count kept and over-long pairs.
        window: pairs tokenized together, then sorted and packed together in dynamic mode
            (default: enough for about 64 full batches of pairs of 8 pieces, at least
            8,192), or placed in rows together by "concat" (default: max(1,024,
            batch_tokens / 8)); static mode tokenizes 1,024 at a time by default.
        pad_id: the id that pads batches (the model's `config.pad_id`).
        batching: in dynamic mode, "packed" sorts each window by target length (batches of
            one length, nearly no padding); "mixed" packs pairs in their shuffled order
            (batches of mixed lengths, about half padding on the sample corpus); "concat"
            places several pairs in each row (see the module docstring).
        row_length: the row length of "concat" (default `max_length`).
        keep_remainder: in static mode, fill each bucket's last, part-full batch up to its
            fixed size with all-padding rows (which weigh nothing in the loss) instead of
            dropping it: for evaluation, which must see every pair.
    """
    row_length = row_length or max_length
    _check_budget(batch_tokens, max_length, batching, row_length)
    if input_context is not None and input_context.num_input_pipelines > 1:
        pairs = pairs.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
        pairs = shuffled_pairs(pairs, shuffle_buffer, seed)
    if repeat:
        pairs = pairs.repeat()
    dataset = _batched(pairs, tokenizer, stats, batching, static, batch_tokens, max_length,
                       num_replicas, window, source_tokens, pad_id, row_length, keep_remainder)
    if shuffle:
        # Batches are shuffled across several windows: a "packed" window (sorted by length)
        # makes about 64 batches, a "concat" one (rows of already shuffled pairs) a few. The
        # buffer fills before the first batch comes, so it is no larger than that needs.
        batches = 32 if batching == "concat" else 256
        dataset = dataset.shuffle(batches, seed=seed + 1, reshuffle_each_iteration=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def shuffled_pairs(pairs, buffer, seed):
    """`pairs` shuffled with a buffer of about `buffer` pairs, reshuffled every epoch.

    A training backup saves the shuffle buffer with the input position while the steps
    wait, and tf.data writes each buffered element as its own entry: the entries, more than
    the bytes, take the time. So a large buffer holds blocks of consecutive pairs (about
    1,000 of them) instead, and a second buffer of 32 blocks' pairs mixes the blocks' pairs
    among themselves: the same reach through the corpus, with a few thousand entries.
    """
    block = max(1, buffer // SHUFFLED_BLOCKS)
    if block == 1:
        return pairs.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    blocks = pairs.batch(block).shuffle(buffer // block, seed=seed, reshuffle_each_iteration=True)
    # seed + 1 shuffles the batches (make_dataset): a seed of its own for each shuffle.
    return blocks.unbatch().shuffle(32 * block, seed=seed + 2, reshuffle_each_iteration=True)


def _check_budget(batch_tokens, max_length, batching, row_length):
    """Raises ConfigError for a batch budget that cannot hold the longest pair or row."""
    if max_length > batch_tokens:
        raise ConfigError(f"batch_tokens={batch_tokens} cannot hold one pair of the maximum "
                          f"length {max_length}: raise batch_tokens or lower max_length.")
    if batching not in BATCHING:
        raise ConfigError(f"batching={batching!r}: choose one of {', '.join(BATCHING)}.")
    if batching == "concat" and not max_length <= row_length <= batch_tokens:
        raise ConfigError(f"row_length={row_length} must hold the longest pair (max_length="
                          f"{max_length}) and fit in batch_tokens={batch_tokens}.")


def _batched(pairs, tokenizer, stats, batching, static, batch_tokens, max_length,
             num_replicas, window, source_tokens, pad_id, row_length, keep_remainder):
    """String pairs -> encoded batches, as `make_dataset`'s arguments of the same names say."""
    drop = static and not keep_remainder
    if batching == "concat":
        window = window or max(1024, batch_tokens // 8)
        dataset = encode_pairs(pairs, tokenizer, max_length, window, stats)
        dataset = dataset.flat_map(_concatenated_rows(row_length, pad_id))
        rows = batch_tokens // row_length
        if static:  # fixed shapes, the batch divisible by the replicas
            rows = max(rows // num_replicas, 1) * num_replicas
        dataset = dataset.batch(rows, drop_remainder=drop)
        return dataset.map(_rows_padded_to([row_length], [rows], pad_id)) if static and not drop \
            else dataset
    if static:
        # One pair per element again; the identity map turns the rows of a ragged window
        # (ragged specs of rank 0) into the plain tensors that bucketing pads.
        dataset = encode_pairs(pairs, tokenizer, max_length, window or 1024, stats).unbatch()
        dataset = dataset.map(
            tf.autograph.experimental.do_not_convert(lambda inputs, labels: (inputs, labels)))
        boundaries = bucket_boundaries(max_length)
        sizes = bucket_batch_sizes(boundaries, batch_tokens, num_replicas)

        @tf.autograph.experimental.do_not_convert
        def length(inputs, labels):
            return tf.maximum(tf.size(inputs["source_ids"]), tf.size(labels))

        dataset = dataset.bucket_by_sequence_length(
            length, boundaries, sizes, pad_to_bucket_boundary=True, drop_remainder=drop,
            padding_values=({"source_ids": pad_id, "target_ids": pad_id}, pad_id))
        if not drop:
            dataset = dataset.map(_rows_padded_to([b - 1 for b in boundaries], sizes, pad_id))
        return dataset
    window = window or max(8192, 64 * batch_tokens // 8)
    source_tokens = source_tokens or batch_tokens * 3 // 2
    return encode_pairs(pairs, tokenizer, max_length, window, stats).flat_map(
        _packed_batches(batch_tokens, source_tokens, pad_id, sort=batching == "packed"))


def _rows_padded_to(lengths, sizes, pad_id):
    """A `map` function: a static-mode batch of padded length lengths[i] gets all-padding rows
    (segment ids and positions 0) up to sizes[i] rows, the fixed shape of its bucket."""
    lengths, sizes = tf.constant(lengths, tf.int32), tf.constant(sizes[:len(lengths)], tf.int32)

    @tf.autograph.experimental.do_not_convert
    def pad(inputs, labels):
        bucket = tf.argmax(tf.cast(tf.equal(lengths, tf.shape(labels)[1]), tf.int32))
        missing = sizes[bucket] - tf.shape(labels)[0]

        def padded(tensor, value):
            return tf.pad(tensor, [[0, missing], [0, 0]], constant_values=value)

        return ({name: padded(t, pad_id if name.endswith("_ids") and "segment" not in name else 0)
                 for name, t in inputs.items()}, padded(labels, pad_id))

    return pad
