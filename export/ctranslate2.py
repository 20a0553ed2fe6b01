"""Export a trained run to CTranslate2, OpenNMT's C++ inference engine (int8 and float16
weights, a cached beam search; fast on CPUs), and translate with it.

    pip install -e ".[ctranslate2]"
    python -m export.ctranslate2 --model_dir runs/sample-tiny --output_dir models/ct2
    python -m export.ctranslate2 --model_dir runs/sample-tiny --output_dir models/ct2-int8 \\
        --quantization int8
    python -m trainers.translate --engine ctranslate2 --model_dir models/ct2 "The dog sleeps."

The converter maps our weights onto `ctranslate2.specs.TransformerSpec` (post-LN or pre-LN,
sinusoidal or learned positions, the shared embedding as both embeddings and the output
projection) and writes the model with CTranslate2's own writer, beside the SentencePiece
vocabulary (vocab.model) and keras_transformer.json (what translation needs to decode as our
`Translator` does). CTranslate2 divides beam scores by |Y| ** alpha, not by the GNMT penalty
of the paper; `Translator(..., penalty="length")` is our search with its normalization.
"""

import argparse
import json
import pathlib
import shutil
import sys

import numpy as np

SETTINGS_FILE = "keras_transformer.json"


class ConversionError(ValueError):
    """A model CTranslate2's Transformer cannot hold; the message says what and why."""


def _check_convertible(config):
    if (config.num_kv_heads or config.num_heads) != config.num_heads:
        raise ConversionError(
            f"num_kv_heads={config.num_kv_heads} (grouped-query attention): CTranslate2's "
            "encoder-decoder Transformer has one key/value head per query head. Export it for "
            "TF Serving instead (python -m export.saved_model).")
    if config.key_dim is not None and config.key_dim * config.num_heads != config.d_model:
        raise ConversionError(
            f"key_dim={config.key_dim} x num_heads={config.num_heads} != d_model="
            f"{config.d_model}: CTranslate2's Transformer splits d_model among the heads.")


class _Weights:
    """A model's float32 weights by path below the model's own name ("transformer",
    "transformer_1", ...), written into CTranslate2's spec objects."""

    def __init__(self, model):
        self.arrays = {w.path.split("/", 1)[1]: np.asarray(w.numpy(), np.float32)
                       for w in model.weights}

    def __getitem__(self, name):
        return self.arrays[name]

    def linear(self, spec, name):  # Keras Dense: kernel [in, out]; CTranslate2: weight [out, in]
        spec.weight, spec.bias = self[f"{name}/kernel"].T, self[f"{name}/bias"]

    def fused(self, spec, names):  # several Dense layers read as one (query, key, value)
        spec.weight = np.concatenate([self[f"{n}/kernel"].T for n in names])
        spec.bias = np.concatenate([self[f"{n}/bias"] for n in names])

    def norm(self, spec, name):
        spec.gamma, spec.beta = self[f"{name}/gamma"], self[f"{name}/beta"]

    def self_attention_and_feed_forward(self, layer, at):
        """The sub-layers an encoder and a decoder layer share, from layer `at`."""
        self.fused(layer.self_attention.linear[0],
                   [f"{at}/self_attention/{n}" for n in ("query", "key", "value")])
        self.linear(layer.self_attention.linear[1], f"{at}/self_attention/attention_output")
        self.norm(layer.self_attention.layer_norm, f"{at}/self_attention_norm")
        self.linear(layer.ffn.linear_0, f"{at}/feed_forward/inner")
        self.linear(layer.ffn.linear_1, f"{at}/feed_forward/outer")
        self.norm(layer.ffn.layer_norm, f"{at}/feed_forward_norm")


def _position_encodings(weights, config, stack):
    """The `stack`'s positions table [max_length, d_model]: learned, or the §3.5 sinusoids."""
    if config.position == "learned":
        return weights[f"{stack}/positions/position_embeddings"]
    from keras_transformer.embedding import sinusoid_table

    return sinusoid_table(np.arange(config.max_length), config.d_model).numpy().astype(np.float32)


def _stacks(weights, config):
    """CTranslate2's encoder and decoder specs, holding our weights."""
    from ctranslate2.specs import transformer_spec as ct2

    encoder = ct2.TransformerEncoderSpec(config.num_layers, config.num_heads,
                                         pre_norm=config.norm_first)
    decoder = ct2.TransformerDecoderSpec(config.num_layers, config.num_heads,
                                         pre_norm=config.norm_first)
    embedding = weights["shared_embedding/embeddings"]
    encoder.embeddings[0].weight = embedding
    decoder.embeddings.weight = embedding
    decoder.projection.weight = embedding  # §3.4: the pre-softmax map shares the embedding
    encoder.position_encodings.encodings = _position_encodings(weights, config, "encoder")
    decoder.position_encodings.encodings = _position_encodings(weights, config, "decoder")
    if config.norm_first:
        weights.norm(encoder.layer_norm, "encoder/final_norm")
        weights.norm(decoder.layer_norm, "decoder/final_norm")
    for index, layer in enumerate(encoder.layer):
        weights.self_attention_and_feed_forward(layer, f"encoder/layer_{index}")
    for index, layer in enumerate(decoder.layer):
        at = f"decoder/layer_{index}"
        weights.self_attention_and_feed_forward(layer, at)
        weights.linear(layer.attention.linear[0], f"{at}/cross_attention/query")
        weights.fused(layer.attention.linear[1],
                      [f"{at}/cross_attention/{n}" for n in ("key", "value")])
        weights.linear(layer.attention.linear[2], f"{at}/cross_attention/attention_output")
        weights.norm(layer.attention.layer_norm, f"{at}/cross_attention_norm")
    return encoder, decoder


def transformer_spec(model, tokenizer):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights (float32) and the
    vocabulary's pieces."""
    from ctranslate2.specs import transformer_spec as ct2

    config = model.config
    _check_convertible(config)
    spec = ct2.TransformerSpec(*_stacks(_Weights(model), config))
    pieces = tokenizer.pieces()
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.unk_token = pieces[tokenizer.unk_id]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[tokenizer.bos_id]
    spec.config.eos_token = pieces[tokenizer.eos_id]
    spec.config.add_source_eos = True  # our sources end with EOS
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def convert(model, tokenizer, vocab_path, output_dir, quantization=None):
    """Writes `model` as a CTranslate2 model in `output_dir` (refusing an existing one), with
    the vocabulary and the settings translation needs. Returns the folder."""
    output_dir = pathlib.Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} exists and is not empty: choose another "
                              "--output_dir or remove it.")
    spec = transformer_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    shutil.copyfile(vocab_path, output_dir / "vocab.model")
    settings = {"max_length": model.config.max_length, "quantization": quantization,
                "eos_id": tokenizer.eos_id}
    (output_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))
    return output_dir


class CTranslate2Translator:
    """Strings in, strings out through a converted model, decoding as our `Translator` does:
    the same tokenization (EOS-terminated sources cut to `max_input_length` pieces), beam
    search or greedy (`beam_size=1`), at most `max_extra` tokens beyond each source
    (sentences are grouped by source length so each group's limit is exact), |Y| ** alpha
    normalization (CTranslate2's)."""

    def __init__(self, model_dir, *, beam_size=4, alpha=0.6, max_extra=50, batch_size=32,
                 max_input_length=None, device="cpu", compute_type="default", threads=0):
        import ctranslate2
        import sentencepiece

        from keras_transformer.config import source_length_limit

        model_dir = pathlib.Path(model_dir)
        if not (model_dir / SETTINGS_FILE).exists():
            raise FileNotFoundError(
                f"{model_dir} is not a CTranslate2 export of this project (no {SETTINGS_FILE}): "
                "make one with python -m export.ctranslate2 --model_dir RUN --output_dir DIR.")
        self.settings = json.loads((model_dir / SETTINGS_FILE).read_text())
        self.sentencepiece = sentencepiece.SentencePieceProcessor(
            model_file=str(model_dir / "vocab.model"))
        self.translator = ctranslate2.Translator(str(model_dir), device=device,
                                                 compute_type=compute_type,
                                                 intra_threads=threads)
        self.beam_size, self.alpha, self.max_extra = beam_size, alpha, max_extra
        self.batch_size = batch_size
        self.max_input_length = source_length_limit(self.settings["max_length"],
                                                    max_extra, max_input_length)

    def encode(self, texts):
        """Source pieces for each text, without the EOS that CTranslate2 appends."""
        keep = self.max_input_length - 1
        return [self.sentencepiece.encode(text.strip(), out_type=str)[:keep] for text in texts]

    def translate_pieces(self, sources):
        """Best output pieces (no EOS) for each list of source pieces, in order."""
        outputs = [None] * len(sources)
        by_length = {}
        for index, pieces in enumerate(sources):
            by_length.setdefault(len(pieces), []).append(index)
        for length, indices in sorted(by_length.items()):
            limit = min(length + 1 + self.max_extra, self.settings["max_length"])  # + EOS
            results = self.translator.translate_batch(
                [sources[i] for i in indices], beam_size=self.beam_size,
                length_penalty=self.alpha, max_decoding_length=limit, max_input_length=0,
                max_batch_size=self.batch_size)
            for index, result in zip(indices, results):
                outputs[index] = result.hypotheses[0]
        return outputs

    def translate(self, texts):
        """Translations in order; blank texts give "" and invalid UTF-8 is refused, as in
        our `Translator` (`translate_texts`)."""
        from keras_transformer.translator import translate_texts

        def translate_nonblank(texts):
            outputs = self.translate_pieces(self.encode(texts))
            return [self.sentencepiece.decode_pieces(pieces) for pieces in outputs]

        return translate_texts(texts, translate_nonblank)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.ctranslate2",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="a trained run's model_dir")
    parser.add_argument("--output_dir", required=True, help="the CTranslate2 model's folder")
    parser.add_argument("--weights", default=None,
                        help="default: averaged.weights.h5, else the newest checkpoint")
    parser.add_argument("--quantization", default=None,
                        choices=("int8", "int8_float32", "int8_float16", "int8_bfloat16",
                                 "int16", "float16", "bfloat16", "float32"),
                        help="weight type (default: float32)")
    args = parser.parse_args(argv)
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print('error: the ctranslate2 package is missing: pip install -e ".[ctranslate2]"',
              file=sys.stderr)
        return 2

    from keras_transformer.config import ConfigError
    from keras_transformer import run_dir

    try:
        model, tokenizer, _ = run_dir.load_trained(args.model_dir, args.weights)
        target = convert(model, tokenizer, pathlib.Path(args.model_dir) / "vocab.model",
                         args.output_dir, args.quantization)
    except (ConversionError, ConfigError, FileNotFoundError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote the CTranslate2 model ({args.quantization or 'float32'}) to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
