"""Sources of sentence pairs: TFDS translation datasets (WMT 2014 by default), local parallel
corpora (two aligned files or one TSV, plain or gzip) and the embedded sample corpus.

Each returns a `tf.data.Dataset` of (source, target) scalar strings. Bad lines in local files
(empty or whitespace-only, not valid UTF-8, not two tab-separated fields) are skipped and
counted, and the counts are logged when a pass over the file ends.
"""

import collections
import gzip
import logging
import pathlib

import tensorflow as tf

from keras_transformer.data import sample_corpus

logger = logging.getLogger(__name__)

PAIR_SPEC = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))


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


class SkipCounter(collections.Counter):
    """Counts skipped lines by reason and logs them at the end of a pass."""

    def log(self, what, kept):
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.items())) or "none"
        logger.info("%s: %d pairs read; skipped: %s", what, kept, skipped)


def _clean_pair(raw_source, raw_target, skipped):
    try:
        source, target = raw_source.decode("utf-8"), raw_target.decode("utf-8")
    except UnicodeDecodeError:
        skipped["not valid UTF-8"] += 1
        return None
    source, target = source.strip(), target.strip()
    if not source or not target:
        skipped["empty"] += 1
        return None
    return source, target


def check_aligned(source_path, target_path):
    """Raises DataError naming both files and both line counts when the counts differ."""
    source_lines, target_lines = _count_lines(source_path), _count_lines(target_path)
    if source_lines != target_lines:
        raise DataError(
            f"Parallel files differ in length: {source_path} has {source_lines} lines, "
            f"{target_path} has {target_lines}. Each line must translate the line of the same "
            "number in the other file.")


def _read_aligned(source_path, target_path, skipped=None):
    skipped = SkipCounter() if skipped is None else skipped
    kept = 0
    with _open(source_path) as sources, _open(target_path) as targets:
        for raw_source, raw_target in zip(sources, targets):
            pair = _clean_pair(raw_source, raw_target, skipped)
            if pair:
                kept += 1
                yield pair
    skipped.log(f"{source_path} + {target_path}", kept)


def read_parallel_files(source_path, target_path, skipped=None):
    """Yields (source, target) pairs from two line-aligned files (plain or .gz), after
    checking that their line counts agree (DataError otherwise)."""
    check_aligned(source_path, target_path)
    yield from _read_aligned(source_path, target_path, skipped)


def read_tsv(path, skipped=None):
    """Yields (source, target) pairs from a TSV file (plain or .gz): source<TAB>target."""
    skipped = SkipCounter() if skipped is None else skipped
    kept = 0
    with _open(path) as lines:
        for raw in lines:
            fields = raw.rstrip(b"\r\n").split(b"\t")
            if len(fields) != 2:
                skipped["not two tab-separated fields"] += 1
                continue
            pair = _clean_pair(fields[0], fields[1], skipped)
            if pair:
                kept += 1
                yield pair
    skipped.log(str(path), kept)


def files_dataset(paths, skipped=None):
    """Pairs from one TSV (`[path]`) or two aligned files (`[source, target]`), re-read at
    every pass. Files are checked (existence, line counts) before this returns."""
    paths = [str(p) for p in paths]
    if len(paths) == 1:
        _count_lines(paths[0])
        generator = lambda: read_tsv(paths[0], skipped)  # noqa: E731
    elif len(paths) == 2:
        check_aligned(*paths)
        generator = lambda: _read_aligned(*paths, skipped=skipped)  # noqa: E731
    else:
        raise DataError(f"Give one TSV file or two aligned files, not {len(paths)}: {paths}.")
    return tf.data.Dataset.from_generator(generator, output_signature=PAIR_SPEC)


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
