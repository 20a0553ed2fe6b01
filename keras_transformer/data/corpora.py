"""Sources of sentence pairs: TFDS translation datasets (WMT 2014 by default), local parallel
corpora (two aligned files or one TSV, plain or gzip) and the embedded sample corpus.

Each returns a `tf.data.Dataset` of (source, target) scalar strings. Local files are read in
the graph (`tf.data.TextLineDataset`, gzip included); bad lines (empty or whitespace-only, not
valid UTF-8, not two tab-separated fields) are skipped and counted (`SkipCounts`).
"""

import gzip
import logging
import pathlib

import tensorflow as tf

from keras_transformer.data import sample_corpus

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """A corpus that cannot be read as asked; the message says what to do."""


def _open(path):
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"Corpus file {str(path)!r} does not exist.")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _count_lines(path):
    with _open(path) as f:
        return sum(1 for _ in f)


class SkipCounts:
    """Lines of local corpus files read, kept and skipped by reason, counted in the graph as
    the dataset is read (accumulated over passes); `log` reports them."""

    REASONS = ("not two tab-separated fields", "not valid UTF-8", "empty")

    def __init__(self):
        self.kept = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.skipped = {reason: tf.Variable(0, dtype=tf.int64, trainable=False)
                        for reason in self.REASONS}

    def count(self, name, condition):
        """Adds the number of True in `condition` (bool tensor) to the counter `name` ("kept"
        or a reason)."""
        variable = self.kept if name == "kept" else self.skipped[name]
        variable.assign_add(tf.reduce_sum(tf.cast(condition, tf.int64)))

    def as_dict(self):
        """{"kept": n, reason: n, ...} as Python ints."""
        return {"kept": int(self.kept.numpy()),
                **{reason: int(v.numpy()) for reason, v in self.skipped.items()}}

    def log(self, what):
        """Logs the counts, naming the input as `what`."""
        counts = self.as_dict()
        skipped = ", ".join(f"{counts[r]} {r}" for r in self.REASONS if counts[r]) or "none"
        logger.info("%s: %d pairs read; skipped: %s", what, counts["kept"], skipped)


def _valid_utf8(text):
    # Transcoding drops invalid sequences only: valid text comes back unchanged.
    return tf.equal(tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="ignore"), text)


# Lines are checked and cleaned a block at a time: one pair at a time, tf.data's overhead per
# element and four counter updates per pair took most of the CPU time of reading a corpus.
BLOCK = 1024


def _clean_pairs(blocks, counts):
    """Blocks of (source, target, well_formed) [n] -> pairs, dropping (and counting) those
    not well formed, not valid UTF-8 or empty once stripped; the rest stripped, in order."""

    @tf.autograph.experimental.do_not_convert  # see pipeline.py's docstring
    def clean(source, target, well_formed):
        valid = _valid_utf8(source) & _valid_utf8(target)
        source, target = tf.strings.strip(source), tf.strings.strip(target)
        empty = (tf.strings.length(source) == 0) | (tf.strings.length(target) == 0)
        counts.count("not two tab-separated fields", ~well_formed)
        counts.count("not valid UTF-8", well_formed & ~valid)
        counts.count("empty", well_formed & valid & empty)
        ok = well_formed & valid & ~empty
        counts.count("kept", ok)
        return tf.boolean_mask(source, ok), tf.boolean_mask(target, ok)

    return blocks.map(clean).unbatch()


def check_aligned(source_path, target_path):
    """The line count of two aligned files; raises DataError naming both files and both
    counts when they differ."""
    source_lines, target_lines = _count_lines(source_path), _count_lines(target_path)
    if source_lines != target_lines:
        raise DataError(
            f"Parallel files differ in length: {source_path} has {source_lines} lines, "
            f"{target_path} has {target_lines}. Each line must translate the line of the same "
            "number in the other file.")
    return source_lines


def _interleaved_regions(lines, count, regions):
    """`lines` (`count` of them) read as `regions` contiguous stretches at once, one line of
    each in turn: a corpus made of several sources one after the other (news, then
    dialogue, ...) then reaches a shuffle buffer already mixed, without being held in memory
    (each stretch is read from the file; its start is reached by reading past the lines
    before it, once per pass)."""
    stretch = -(-count // regions)
    return tf.data.Dataset.range(regions).interleave(
        lambda i: lines.skip(i * stretch).take(stretch), cycle_length=regions, block_length=1)


def _lines(path):
    _open(path).close()  # DataError now if it does not exist
    return tf.data.TextLineDataset(str(path), compression_type="GZIP" if str(path).endswith(".gz")
                                   else "")


def files_dataset(paths, counts=None, regions=1):
    """Pairs from one TSV (`[path]`, source<TAB>target) or two aligned files (`[source,
    target]`), plain or .gz, read in the graph by `tf.data.TextLineDataset` and re-read at
    every pass. Lines that are empty, not valid UTF-8 or (TSV) not two tab-separated fields
    are skipped and counted in `counts` (a `SkipCounts`). Files are checked (existence, line
    counts) before this returns. `regions` > 1 reads that many stretches of the files at
    once, interleaved (for training: see `_interleaved_regions`); 1 keeps the files' order."""
    counts = SkipCounts() if counts is None else counts
    paths = [str(p) for p in paths]
    if len(paths) == 1:
        count = _count_lines(paths[0]) if regions > 1 else None
        lines = _lines(paths[0])
    elif len(paths) == 2:
        count = check_aligned(*paths)
        lines = tf.data.Dataset.zip((_lines(paths[0]), _lines(paths[1])))
    else:
        raise DataError(f"Give one TSV file or two aligned files, not {len(paths)}: {paths}.")
    if regions > 1:
        lines = _interleaved_regions(lines, count, regions)
    blocks = lines.batch(BLOCK)
    if len(paths) == 1:
        @tf.autograph.experimental.do_not_convert  # see pipeline.py's docstring
        def fields(block):
            parts = tf.strings.split(block, "\t")
            padded = parts.to_tensor(default_value="", shape=[None, 2])
            return padded[:, 0], padded[:, 1], parts.row_lengths() == 2

        blocks = blocks.map(fields)
    else:
        blocks = blocks.map(tf.autograph.experimental.do_not_convert(
            lambda source, target: (source, target, tf.ones_like(source, tf.bool))))
    return _clean_pairs(blocks, counts)


def sample_dataset(split):
    """The embedded sample corpus (English -> German)."""
    english, german = zip(*sample_corpus.sample_pairs(split))
    return tf.data.Dataset.from_tensor_slices((list(english), list(german)))


def tfds_languages(name):
    """("en", "de") for "wmt14_translate/de-en": the config name lists the language pair."""
    config = name.split("/")[-1]
    languages = tuple(config.split("-"))
    if "/" not in name or len(languages) != 2:
        raise DataError(f"TFDS name {name!r} does not name a language pair; use e.g. "
                        "'wmt14_translate/de-en'.")
    return languages


def tfds_dataset(name="wmt14_translate/de-en", split="train", source_language="en",
                 target_language=None, data_dir=None, download=True):
    """(source, target) pairs of a TFDS translation dataset, English -> German by default.

    Raises DataError, saying what was tried and how to point `data_dir` at a prepared copy,
    when the dataset is neither in `data_dir` nor downloadable.
    """
    import tensorflow_datasets as tfds

    languages = tfds_languages(name)
    if target_language is None:
        target_language = next(lang for lang in languages if lang != source_language)
    if {source_language, target_language} != set(languages):
        raise DataError(f"{name} holds {languages}; cannot translate {source_language} -> "
                        f"{target_language}.")
    try:
        dataset = tfds.load(name, split=split, data_dir=data_dir, download=download,
                            shuffle_files=False)
    except Exception as error:  # TFDS raises many kinds; all mean "not available here"
        raise DataError(
            f"Could not load TFDS dataset {name!r}, split {split!r} (tried tfds.load with "
            f"data_dir={data_dir!r}, download={download}): {type(error).__name__}: {error}\n"
            f"On a machine without network, prepare it where there is one, e.g. "
            f"`tfds build {name.split('/')[0]} --config {name.split('/')[-1]} --data_dir DIR`, "
            "copy DIR here and pass it as data_dir (--data_dir on the command line)."
        ) from error
    return dataset.map(lambda ex: (ex[source_language], ex[target_language]),
                       num_parallel_calls=tf.data.AUTOTUNE)
