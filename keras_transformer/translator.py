"""Strings in, strings out: a tokenizer and a model behind one call."""

import concurrent.futures
import logging
import time
import weakref

import numpy as np
import tensorflow as tf

from keras_transformer.config import source_length_limit
from keras_transformer.decoding import beam_search, greedy_search

logger = logging.getLogger(__name__)
PROGRESS_SECONDS = 5  # a long translation logs its progress this often


class Translator:
    """Translates lists of strings with beam search (the paper's settings by default).

    Sentences are tokenized (source + EOS), cut to `max_input_length` tokens (the EOS kept),
    sorted by length and decoded `batch_size` at a time, padded to a multiple of 8; the results
    come back in the order given. Beam search stops as soon as each sentence's best hypothesis
    is settled (`num_return=1`). `beam_size=1` decodes greedily; `penalty` is the length
    penalty's form (see `decoding.length_penalty`). Up to `concurrent_batches` batches are
    decoded at once, each by its own call of the same traced search: one decoding step's ops
    are too small to keep every core busy, and a second batch's ops fill the gaps. Each
    batch's result is the same whatever the number.
    """

    def __init__(self, model, tokenizer, *, beam_size=4, alpha=0.6, max_extra=50,
                 batch_size=32, max_input_length=None, jit_compile=False, penalty="gnmt",
                 concurrent_batches=2):
        tokenizer.check_padding(model.config)
        self.model, self.tokenizer = model, tokenizer
        self.beam_size, self.alpha, self.max_extra = beam_size, alpha, max_extra
        self.penalty = penalty
        self.batch_size, self.jit_compile = batch_size, jit_compile
        if concurrent_batches < 1:
            raise ValueError(f"concurrent_batches={concurrent_batches}: decode at least one "
                             "batch at a time (1 decodes them one after the other).")
        self.concurrent_batches = concurrent_batches
        self.max_input_length = source_length_limit(model.config.max_length, max_extra,
                                                    max_input_length)
        # One trace of each search serves every batch shape and option value (they are
        # tensors), every Translator of this model, and the SavedModel export, which calls
        # these same traces (export/saved_model.py): the trainer's validation, its final
        # evaluation and its export trace each search once.
        self._greedy, self._beam = traced_searches(model, tokenizer.bos_id, tokenizer.eos_id,
                                                   penalty)
        # XLA compiles a fixed shape, so with it the padded widths below keep the traces few.
        self._decode = (tf.function(self._decode_batch, jit_compile=True, reduce_retracing=True,
                                    autograph=False)
                        if jit_compile else self._decode_batch)

    def search(self, source_ids, beam_size, alpha, max_extra, num_return=1):
        """ids [N, S] (EOS-terminated, padded) -> the `num_return` best hypotheses: ids
        [N, num_return, L] and scores [N, num_return]. The options may be Python numbers or
        scalar tensors (then a `tf.cond` picks the search); a beam of 1 is greedy search, its
        score the sum of the log-probabilities, as in CTranslate2."""
        def greedy():
            return self._greedy(source_ids, tf.cast(max_extra, tf.int32))

        def beam():
            return self._beam(source_ids, tf.cast(beam_size, tf.int32),
                              tf.cast(alpha, tf.float32), tf.cast(max_extra, tf.int32),
                              tf.cast(num_return, tf.int32))

        if not tf.is_tensor(beam_size):
            return greedy() if beam_size == 1 else beam()
        return tf.cond(tf.equal(beam_size, 1), greedy, beam)

    def _decode_batch(self, source_ids):
        if not self.jit_compile:
            return self.search(source_ids, self.beam_size, self.alpha, self.max_extra)[0][:, 0]
        # Under XLA the options stay Python numbers: the shapes they decide must be static.
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        if self.beam_size == 1:
            return greedy_hypotheses(self.model, source_ids, bos, eos, self.max_extra)[0][:, 0]
        return beam_hypotheses(self.model, source_ids, bos, eos, self.penalty, self.beam_size,
                               self.alpha, self.max_extra, 1)[0][:, 0]

    def encode(self, texts):
        """Source ids (EOS-terminated, cut to max_input_length) for each text, as lists."""
        ids = self.tokenizer.tokenize(tf.constant(texts, tf.string)).to_list()
        keep = self.max_input_length - 1
        return [row[:keep] + [self.tokenizer.eos_id] for row in ids]

    def translate_ids(self, sources):
        """Best output ids (padded with config.pad_id) for a list of source id lists, in order.
        Ids outside [0, vocab_size) are refused (ValueError naming the row): on a GPU or TPU
        the embedding lookup would return zeros for them, silently."""
        vocab = self.model.config.vocab_size
        for row, ids in enumerate(sources):
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise ValueError(f"source row {row}: id {bad[0]} is outside the vocabulary "
                                 f"[0, {vocab}); pass ids from this model's tokenizer.")
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        batches = [order[start:start + self.batch_size]
                   for start in range(0, len(order), self.batch_size)]

        def decode(chosen):
            width = -(-max(len(sources[i]) for i in chosen) // 8) * 8
            batch = np.full((len(chosen), width), self.model.config.pad_id, np.int32)
            for row, i in enumerate(chosen):
                batch[row, :len(sources[i])] = sources[i]
            return self._decode(tf.constant(batch)).numpy()

        outputs = [None] * len(sources)
        began = last_report = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(self.concurrent_batches) as pool:
            # The first batch alone, so that the search is traced once before calls overlap.
            first = decode(batches[0]) if batches else None
            pending = [pool.submit(decode, chosen) for chosen in batches[1:]]
            try:
                for n, chosen in enumerate(batches):
                    if time.monotonic() - last_report >= PROGRESS_SECONDS:
                        last_report = time.monotonic()
                        logger.info("translated %d of %d sentences (%.1f sentences/s)",
                                    n * self.batch_size, len(order),
                                    n * self.batch_size / (last_report - began))
                    decoded = first if n == 0 else pending[n - 1].result()
                    for row, i in enumerate(chosen):
                        outputs[i] = decoded[row]
            finally:
                for future in pending:  # after an error, the batches not started yet
                    future.cancel()
        return outputs

    def translate(self, texts):
        """A list of source strings -> a list of translations, in the same order (see
        `translate_texts`: blanks give "", invalid UTF-8 is refused)."""
        return translate_texts(texts, self._translate_nonblank)

    def _translate_nonblank(self, texts):
        outputs = self.translate_ids(self.encode(texts))
        ragged = tf.ragged.constant([row.tolist() for row in outputs], dtype=tf.int32)
        return [t.decode("utf-8") for t in self.tokenizer.detokenize(ragged).numpy()]


def greedy_hypotheses(model, source_ids, bos_id, eos_id, max_extra):
    """Greedy search as a 1-best list: ids [N, 1, L] and scores [N, 1]."""
    result = greedy_search(model, source_ids, bos_id=bos_id, eos_id=eos_id, max_extra=max_extra)
    return result["sequences"][:, None], result["scores"][:, None]


def beam_hypotheses(model, source_ids, bos_id, eos_id, penalty, beam_size, alpha, max_extra,
                    num_return):
    """Beam search's `num_return` best: ids [N, num_return, L] and scores [N, num_return]."""
    result = beam_search(model, source_ids, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size,
                         alpha=alpha, max_extra=max_extra, penalty=penalty,
                         num_return=num_return)
    return result["sequences"], result["scores"]


# The traced searches of each model, shared by all its Translators:
# {model: {(bos_id, eos_id, penalty): (greedy, beam)}}, forgotten with the model.
_SEARCHES = weakref.WeakKeyDictionary()


def traced_searches(model, bos_id, eos_id, penalty):
    """(greedy, beam): `greedy_hypotheses` of (ids [N, S] int32, max_extra) and
    `beam_hypotheses` of (ids, beam_size, alpha, max_extra, num_return) for `model`, the
    options scalar tensors, each traced at its first call and kept for the model."""
    searches = _SEARCHES.setdefault(model, {})
    key = (bos_id, eos_id, penalty)
    if key not in searches:
        model_ref = weakref.ref(model)  # the traces must not keep the model alive
        ids, scalar = tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32)
        searches[key] = (
            traced_once(lambda source_ids, max_extra: greedy_hypotheses(
                model_ref(), source_ids, bos_id, eos_id, max_extra), [ids, scalar]),
            traced_once(lambda source_ids, *options: beam_hypotheses(
                model_ref(), source_ids, bos_id, eos_id, penalty, *options),
                [ids, scalar, tf.TensorSpec([], tf.float32), scalar, scalar]))
    return searches[key]


def traced_once(function, input_signature):
    """`function` traced at its first call, for `input_signature`, and from then on called as
    that one trace, from eager code and from inside other traces alike. (A `tf.function`
    called inside another function's trace is traced again wherever its cache key differs:
    under `tf.saved_model.save`, for one, whose export would otherwise trace the searches once
    more.) No autograph: each search is one keras.ops.while_loop already (decoding.py), and
    converting it only slows the trace."""
    traced = []

    def call(*args):
        if not traced:
            traced.append(tf.function(function, autograph=False,
                                      input_signature=input_signature).get_concrete_function())
        return traced[0](*args)
    return call


def translate_texts(texts, translate):
    """The translations of `texts` by `translate` (a function of a list of non-blank str),
    in order. One behaviour for every engine, as in the SavedModel: a blank text gives ""
    without being decoded (decoding nothing but EOS invents a sentence); bytes that are not
    valid UTF-8 are refused with a ValueError naming the row."""
    texts = checked_texts(texts)
    translations = [""] * len(texts)
    rows = [i for i, text in enumerate(texts) if text.strip()]
    for i, translation in zip(rows, translate([texts[i] for i in rows]) if rows else []):
        translations[i] = translation
    return translations


def checked_texts(texts):
    """`texts` (str, or UTF-8 bytes) as a list of str; ValueError naming the first row whose
    bytes are not UTF-8 (translating them would invent a sentence)."""
    checked = []
    for row, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"input row {row} is not valid UTF-8 ({error.reason} at byte "
                                 f"{error.start}): decode it or drop it.") from None
        checked.append(text)
    return checked
