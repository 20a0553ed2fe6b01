"""Export a trained model as a SavedModel that TF Serving loads as it is: strings in,
translations out, with SentencePiece tokenization and beam search in the graph.

    python -m export.saved_model --model_dir runs/sample-tiny --export_dir models/transformer

writes models/transformer/<version>/ (the next integer unless --version is given), the layout
TF Serving watches, with the vocabulary in assets/ and warm-up requests in assets.extra/.
Signatures (outputs after the arrow):

    serving_default         inputs: string [N]
                            -> translations: string [N], scores: float [N]
    translate_with_options  inputs: string [N], and per row ([N]) or for all (a scalar):
                            beam_size: int32 (1..max_beam_size; 1 is greedy), alpha:
                            float32 (0..10),
                            max_extra: int32 (>= 0), num_return: int32 (1..beam_size)
                            -> translations [N], scores [N] (the best), nbest_translations
                               [N, K], nbest_scores [N, K] (K = the largest num_return)
    translate_ids           source_ids: int32 [N, S] (EOS-terminated, padded with config.pad_id)
                            -> sequences: int32 [N, L], scores: float [N]

Requests: an empty (or blank) string gives an empty translation and score 0; an input longer
than `max_input_length` pieces (default config.max_length - max_extra) is cut to its first
pieces (and still ends with EOS, in `translate_ids` too; there an all-padding row gives an
empty sequence and score 0); an empty batch gives an empty result; inputs that are not valid
UTF-8, ids outside the vocabulary, a beam_size outside 1..max_beam_size (default 16), an alpha
outside [0, 10] (NaN included), a negative max_extra and a num_return outside 1..beam_size are
refused with InvalidArgumentError naming the input or option. n-best columns beyond a row's
num_return are empty strings with score 0.

Batching (TF Serving's `--enable_batching`) merges requests by concatenating every input along
its first dimension, so it cannot merge scalars: under batching send the options one per row
(`[N]`), as the warm-up requests do; rows with different options are searched group by group.
`export/batching_parameters.txt` is a starting point for `--batching_parameters_file`.
Loading needs `import tensorflow_text` first (stock TF Serving links its ops).
"""

import argparse
import logging
import pathlib
import shutil
import sys

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from export.serving_options import OPTION_DTYPES, OPTIONS
from keras_transformer.config import ConfigError, source_length_limit
from keras_transformer.tokenizer import BOS_ID, EOS_ID, Tokenizer
from keras_transformer.translator import Translator

logger = logging.getLogger(__name__)

SIGNATURE_NAMES = ("serving_default", "translate_with_options", "translate_ids")
MAX_ALPHA = 10.0  # GNMT's penalty is used with alpha in [0, 1]; beyond 10 no score is finite
ALPHA_RANGE = f"alpha must be a number in [0, {MAX_ALPHA:g}]"
WARMUP_FILE = "tf_serving_warmup_requests"


class TranslationModule(tf.Module):
    """The exported object: the model, the vocabulary asset and the serving functions."""

    def __init__(self, model, vocab_path, beam_size=4, alpha=0.6, max_extra=50,
                 max_input_length=None, max_beam_size=16, translator=None):
        super().__init__(name="translation")
        self.model = model
        # The vocabulary travels as an asset (assets/vocab.model) for clients that tokenize
        # themselves; the TF Text op holds the same bytes as an attribute of its graph node
        # (SentencepieceOp takes its model as an attribute, not as a tensor it could read).
        self.vocab = tf.saved_model.Asset(str(vocab_path))
        proto = pathlib.Path(vocab_path).read_bytes()
        self.sentencepiece = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)
        self._tokenizer = Tokenizer(proto, self.sentencepiece)
        # The signatures call the Translator's traced searches, which every Translator of
        # `model` shares (translator.py): a model that has translated already (the final
        # evaluation's) spares the export their traces.
        if translator is not None and translator.model is not model:
            raise ValueError("translator: a Translator of the exported model, or None.")
        self._translator = translator or Translator(model, self._tokenizer)
        self.beam_size, self.alpha, self.max_extra = beam_size, alpha, max_extra
        self.max_input_length = source_length_limit(model.config.max_length, max_extra,
                                                    max_input_length)
        self.max_beam_size = max_beam_size

    def encode(self, texts):
        """[N] strings -> [N, S] ids: pieces cut to max_input_length - 1, then EOS, padded.
        Rows that are not valid UTF-8 are refused (InvalidArgumentError naming them):
        translating replacement characters would invent a sentence."""
        repaired = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                                replace_control_characters=False)
        invalid = tf.where(tf.not_equal(repaired, texts))[:, 0]
        check = tf.debugging.Assert(tf.equal(tf.size(invalid), 0),
                                    ["inputs: not valid UTF-8 in row(s)", invalid], summarize=10)
        with tf.control_dependencies([check]):
            texts = tf.identity(texts)
        pieces = self._tokenizer.tokenize(texts)[:, :self.max_input_length - 1]
        eos = tf.fill([tf.shape(texts)[0], 1], EOS_ID)
        pieces = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
        return pieces.to_tensor(default_value=self.model.config.pad_id)

    def detokenize(self, sequences):
        """ids [N, K, L] -> strings [N, K]."""
        shape = tf.shape(sequences)
        flat = tf.reshape(sequences, [shape[0] * shape[1], shape[2]])
        return tf.reshape(self._tokenizer.detokenize(flat), shape[:2])

    def search(self, source_ids, beam_size, alpha, max_extra, num_return=1):
        """[N, S] ids -> the `num_return` best hypotheses: ids [N, num_return, L], scores
        [N, num_return] (`Translator.search`: a beam of 1 is greedy)."""
        return self._translator.search(source_ids, beam_size, alpha, max_extra, num_return)

    def search_at_export_options(self, source_ids):
        """[N, S] ids -> (ids [N, 1, L], scores [N, 1]) at beam_size, alpha and max_extra."""
        return self.search(source_ids, self.beam_size, self.alpha, self.max_extra)

    def translate(self, texts):
        sequences, scores = self.search_at_export_options(self.encode(texts))
        translations = self.detokenize(sequences)[:, 0]
        blank = tf.equal(tf.strings.strip(texts), "")
        return {"translations": tf.where(blank, "", translations),
                "scores": tf.where(blank, 0.0, scores[:, 0])}

    def translate_per_row(self, texts, options):
        """Rows that share their options ([N] each: beam_size, alpha, max_extra, num_return)
        are searched together, one group after the other; the n-best columns beyond a row's
        num_return are empty strings with score 0."""
        source_ids = self.encode(texts)
        rows = tf.shape(texts)[0]
        width = tf.reduce_max(tf.concat([options["num_return"], [1]], 0))
        keys = tf.stack([tf.cast(options[name], tf.float64) for name in OPTIONS], axis=1)
        groups, group_of_row = tf.raw_ops.UniqueV2(x=keys, axis=tf.constant([0], tf.int64))

        def search_group(g, translations, scores):
            members = tf.where(tf.equal(group_of_row, g))[:, 0]
            beam_size, alpha, max_extra, num_return = tf.unstack(groups[g], num=len(OPTIONS))
            sequences, best = self.search(
                tf.gather(source_ids, members), tf.cast(beam_size, tf.int32),
                tf.cast(alpha, tf.float32), tf.cast(max_extra, tf.int32),
                tf.cast(num_return, tf.int32))
            missing = width - tf.shape(best)[1]  # columns beyond this group's num_return
            text = tf.concat([self.detokenize(sequences),
                              tf.fill([tf.shape(members)[0], missing], "")], axis=1)
            best = tf.pad(best, [[0, 0], [0, missing]])
            translations = tf.tensor_scatter_nd_update(translations, members[:, None], text)
            scores = tf.tensor_scatter_nd_update(scores, members[:, None], best)
            return g + 1, translations, scores

        _, translations, scores = tf.while_loop(
            lambda g, *_: g < tf.shape(groups)[0], search_group,
            (tf.constant(0), tf.fill([rows, width], ""), tf.zeros([rows, width])))
        blank = tf.equal(tf.strings.strip(texts), "")[:, None]
        translations, scores = tf.where(blank, "", translations), tf.where(blank, 0.0, scores)
        return {"translations": translations[:, 0], "scores": scores[:, 0],
                "nbest_translations": translations, "nbest_scores": scores}

    # No autograph: the signatures' loops and branches are tf.while_loop and tf.cond already,
    # and converting them only slows the export.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
                 autograph=False)
    def serving_default(self, inputs):
        return self.translate(inputs)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")] + [
        tf.TensorSpec(None, dtype, name=name) for name, dtype in OPTION_DTYPES.items()],
        autograph=False)
    def translate_with_options(self, inputs, beam_size, alpha, max_extra, num_return):
        rows = tf.shape(inputs)[0]
        options = dict(beam_size=beam_size, alpha=alpha, max_extra=max_extra,
                       num_return=num_return)
        for name, value in options.items():
            value = tf.reshape(value, [-1])
            shape_check = tf.debugging.assert_equal(
                (tf.size(value) == 1) | (tf.size(value) == rows), True,
                message=f"{name} must be one value, or one value per input")
            with tf.control_dependencies([shape_check]):
                options[name] = tf.broadcast_to(value, [rows])
        beam_size, alpha = options["beam_size"], options["alpha"]
        checks = [
            tf.debugging.assert_positive(beam_size, message="beam_size must be >= 1"),
            tf.debugging.assert_less_equal(
                beam_size, self.max_beam_size,
                message=f"beam_size must be <= {self.max_beam_size} (--max_beam_size at export)"),
            # NaN >= 0 is false too: a NaN alpha is refused with the negative ones. A huge
            # alpha makes every normalised score -0.0 and the search arbitrary.
            tf.debugging.assert_greater_equal(alpha, 0.0, message=ALPHA_RANGE),
            tf.debugging.assert_less_equal(alpha, MAX_ALPHA, message=ALPHA_RANGE),
            tf.debugging.assert_non_negative(options["max_extra"],
                                             message="max_extra must be >= 0"),
            tf.debugging.assert_positive(options["num_return"],
                                         message="num_return must be >= 1"),
            tf.debugging.assert_less_equal(options["num_return"], beam_size,
                                           message="num_return must be <= beam_size")]
        with tf.control_dependencies(checks):
            options = {name: tf.identity(value) for name, value in options.items()}
        options["max_extra"] = tf.minimum(options["max_extra"], self.model.config.max_length - 1)
        return self.translate_per_row(inputs, options)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")],
                 autograph=False)
    def translate_ids(self, source_ids):
        # Like the string signatures: a source longer than max_input_length keeps its first
        # pieces and still ends with EOS; an empty (all-padding) row gives an empty result.
        pad, vocab = self.model.config.pad_id, self.model.config.vocab_size
        # Checked here: on a GPU or TPU the embedding lookup returns zeros for them, silently.
        outside = tf.where(tf.reduce_any((source_ids < 0) | (source_ids >= vocab), axis=1))[:, 0]
        check = tf.debugging.Assert(
            tf.equal(tf.size(outside), 0),
            [f"source_ids: ids outside the vocabulary [0, {vocab}) in row(s)", outside],
            summarize=10)
        with tf.control_dependencies([check]):
            source_ids = tf.identity(source_ids)
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, pad), tf.int32), axis=1)
        cut = source_ids[:, :self.max_input_length]
        last = tf.equal(tf.range(tf.shape(cut)[1]), self.max_input_length - 1)
        cut = tf.where((lengths > self.max_input_length)[:, None] & last[None], EOS_ID, cut)
        sequences, scores = self.search_at_export_options(cut)
        empty = tf.equal(lengths, 0)
        return {"sequences": tf.where(empty[:, None], pad, sequences[:, 0]),
                "scores": tf.where(empty, 0.0, scores[:, 0])}


def next_version(export_dir):
    versions = [int(p.name) for p in pathlib.Path(export_dir).glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


def per_row(rows, **options):
    """Each option as one value per row, typed as `translate_with_options` takes it."""
    dtypes = {"beam_size": "int32", "alpha": "float32", "max_extra": "int32",
              "num_return": "int32"}
    return {name: np.full([rows], value, dtypes[name]) for name, value in options.items()}


def write_warmup_requests(version_dir, model_name, examples):
    """`assets.extra/tf_serving_warmup_requests`: one PredictionLog per signature, so TF
    Serving traces and runs each before the first real request."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    def request(signature, inputs):
        predict = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
        for key, value in inputs.items():
            predict.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        return prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=predict))

    records = [
        request("serving_default", {"inputs": examples}),
        request("translate_with_options", {  # one value per row: batching merges these
            "inputs": examples, **per_row(len(examples), beam_size=2, alpha=0.6, max_extra=10,
                                          num_return=2)}),
        request("translate_ids", {"source_ids": [[BOS_ID + 10, EOS_ID]]}),
    ]
    path = pathlib.Path(version_dir) / "assets.extra" / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    return path


def export(model, vocab_path, export_dir, version=None, model_name="transformer",
           warmup_examples=("Hello.",), translator=None, **settings):
    """Writes `<export_dir>/<version>/` and returns its path. `translator`: a `Translator` of
    `model` (its length penalty; its traced searches, shared by every Translator of the model,
    the signatures reuse); by default a new one."""
    version = version or next_version(export_dir)
    target = pathlib.Path(export_dir) / str(version)
    if target.exists():
        raise FileExistsError(f"{target} exists: choose another --version.")
    module = TranslationModule(model, vocab_path, translator=translator, **settings)
    signatures = {name: getattr(module, name) for name in SIGNATURE_NAMES}
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("exporting %s: tracing %d signatures (tens of seconds)", target, len(signatures))
    tf.saved_model.save(module, str(staging), signatures=signatures)
    write_warmup_requests(staging, model_name, list(warmup_examples))
    staging.rename(target)  # TF Serving never sees a half-written version
    logger.info("exported %s", target)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.saved_model",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="a trained run's model_dir")
    parser.add_argument("--export_dir", default="models/transformer")
    parser.add_argument("--version", type=int, default=None)
    parser.add_argument("--model_name", default="transformer",
                        help="the name TF Serving serves it under (for the warm-up requests)")
    parser.add_argument("--weights", default=None)
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max_extra", type=int, default=50)
    parser.add_argument("--max_input_length", type=int, default=None)
    parser.add_argument("--max_beam_size", type=int, default=16,
                        help="the largest beam_size a request may ask for")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "tensorflow"):  # SavedModel tracing chatter
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from keras_transformer import run_dir

    try:
        model, _, settings = run_dir.load_trained(args.model_dir, args.weights)
        examples = ["Hello.", "This is a warm-up request."]
        target = export(model, pathlib.Path(args.model_dir) / "vocab.model", args.export_dir,
                        args.version, args.model_name, examples, beam_size=args.beam_size,
                        alpha=args.alpha, max_extra=args.max_extra,
                        max_input_length=args.max_input_length,
                        max_beam_size=args.max_beam_size)
    except (FileNotFoundError, FileExistsError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Exported {target} (signatures: {', '.join(SIGNATURE_NAMES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
