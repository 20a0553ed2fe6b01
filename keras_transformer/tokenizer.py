"""The shared source-target vocabulary (§5.1): SentencePiece BPE, tokenizing in the graph.

Training uses the `sentencepiece` package; tokenization and detokenization use the TF Text
SentencePiece op, so `tf.data` pipelines and exported SavedModels carry it. Normalization is
the identity, inner whitespace is kept and unknown characters fall back to bytes, so
detokenization gives back exactly the text that was tokenized, less leading and trailing
whitespace (stripped before tokenizing).
"""

import hashlib
import io
import logging
import pathlib
import re
import time

import tensorflow as tf

from keras_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ConfigError  # noqa: F401

logger = logging.getLogger(__name__)


class Tokenizer:
    """A SentencePiece model shared by source and target, with fixed special ids:
    pad 0, BOS 1, EOS 2, unknown 3.

    `tokenize(strings [N]) -> tf.RaggedTensor [N, None] int32` (stripped; no BOS/EOS added).
    `detokenize(ids [N, L] or ragged) -> strings [N]`: stops at the first EOS and drops
    padding and BOS.
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, model_proto, sentencepiece=None):
        """`sentencepiece`: a `tensorflow_text.SentencepieceTokenizer` to use as it is (an
        exported one reads its model from a SavedModel asset); by default one is built from
        the proto."""
        self.model_proto = bytes(model_proto)
        self._sentencepiece, self._pinned = sentencepiece, sentencepiece is not None
        self.vocab_size = int(self._ops().vocab_size())

    def _ops(self):
        """The TF Text tokenizer. Its SentencePiece resource is owned by an eager kernel that
        `tf.random.set_seed` (hence `keras.utils.set_random_seed`) discards; it is rebuilt
        then, outside any graph being traced, so graphs capture a live one."""
        if self._pinned:
            return self._sentencepiece
        with tf.init_scope():
            try:
                if self._sentencepiece is not None:
                    self._sentencepiece.vocab_size()
                    return self._sentencepiece
            except tf.errors.NotFoundError:
                pass
            import tensorflow_text  # loaded on first use: `import keras_transformer` stays light

            self._sentencepiece = tensorflow_text.SentencepieceTokenizer(
                model=self.model_proto, out_type=tf.int32)
        return self._sentencepiece

    @classmethod
    def train(cls, sentences, vocab_size, max_sentences=2_000_000):
        """Trains a BPE model on an iterable of strings (source and target sentences alike).
        The vocabulary may come out smaller than `vocab_size` on a small corpus."""
        import sentencepiece

        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type="bpe",
            vocab_size=vocab_size, hard_vocab_limit=False, pad_id=PAD_ID, bos_id=BOS_ID,
            eos_id=EOS_ID, unk_id=UNK_ID, normalization_rule_name="identity",
            remove_extra_whitespaces=False, byte_fallback=True, character_coverage=0.9999,
            input_sentence_size=max_sentences, shuffle_input_sentence=True,
            num_threads=2, minloglevel=2,
        )
        return cls(model.getvalue())

    @classmethod
    def load(cls, path):
        """The tokenizer of a SentencePiece model file."""
        return cls(pathlib.Path(path).read_bytes())

    def save(self, path):
        """Writes the SentencePiece model to `path`; returns the path."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model_proto)
        return path

    def pieces(self):
        """Every piece of the vocabulary, as text, in id order."""
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]

    def tokenize(self, strings):
        """strings [N] -> ids, a tf.RaggedTensor [N, None] int32 (stripped; no BOS/EOS)."""
        return self._ops().tokenize(tf.strings.strip(strings))

    def detokenize(self, ids):
        """ids [N, L] (or ragged) -> strings [N], stopping at the first EOS, without padding
        or BOS."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids, tf.int32))
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
        keep = before_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
        return self._ops().detokenize(tf.ragged.boolean_mask(ids, keep))

    def check_padding(self, config):
        """Raises ConfigError unless `config.pad_id` is this vocabulary's pad id: the model's
        padding masks and the decoders' output padding must be the padding the tokenizer
        drops."""
        if config.pad_id != self.pad_id:
            raise ConfigError(f"config.pad_id={config.pad_id} differs from the vocabulary's pad "
                              f"id {self.pad_id}: set pad_id={self.pad_id} in the model config.")

    def id_to_piece(self, ids):
        """ids (any shape) -> their pieces as strings (same shape)."""
        return self._ops().id_to_string(ids)


def _reported(sentences, every_seconds=10):
    """`sentences`, logging how many have been read every `every_seconds` and when the
    reading ends (SentencePiece then trains without a word)."""
    start = last = time.monotonic()
    count = 0
    for count, sentence in enumerate(sentences, 1):
        if time.monotonic() - last >= every_seconds:
            last = time.monotonic()
            logger.info("vocabulary: %d sentences read (%.0f/s)", count, count / (last - start))
        yield sentence
    logger.info("vocabulary: %d sentences read; training BPE on them", count)


def load_or_train_tokenizer(sentences_fn, vocab_size, cache_dir, corpus_key):
    """The tokenizer cached under `cache_dir` for (`corpus_key`, `vocab_size`), trained from
    `sentences_fn()` (an iterable of training sentences) the first time."""
    safe_key = re.sub(r"[^A-Za-z0-9_.-]+", "_", corpus_key)
    digest = hashlib.sha1(corpus_key.encode("utf-8")).hexdigest()[:8]
    path = pathlib.Path(cache_dir) / f"spm-{safe_key}-{digest}-{vocab_size}.model"
    if path.exists():
        logger.info("Loading the cached vocabulary %s", path)
        return Tokenizer.load(path)
    logger.info("Training a %d-piece BPE vocabulary for %s", vocab_size, corpus_key)
    start = time.monotonic()
    tokenizer = Tokenizer.train(_reported(sentences_fn()), vocab_size)
    logger.info("Trained the vocabulary in %.0f s", time.monotonic() - start)
    tmp = path.with_suffix(".tmp")
    tokenizer.save(tmp)
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    logger.info("Saved the vocabulary (%d pieces) to %s", tokenizer.vocab_size, path)
    return tokenizer
