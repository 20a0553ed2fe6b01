"""The Transformer as a keras-hub model: a `Backbone`, a SentencePiece tokenizer, a
`Seq2SeqLMPreprocessor` and a `Seq2SeqLM` whose `generate()` runs this library's cached
greedy and beam search (§6.1), so that keras-hub's API works on a trained run:

    import keras_hub, keras_transformer
    lm = keras_hub.models.Seq2SeqLM.from_preset("runs/sample-tiny-preset")
    lm.compile(sampler=keras_transformer.hub.BeamSearch(beam_size=4, alpha=0.6))
    lm.generate(["The dog sleeps."])

The backbone holds a `keras_transformer.Transformer` (`backbone.transformer`): its layers are
the backbone's layers and its variables the backbone's weights, so both views of the model
read and train the same numbers. `python -m export.keras_hub` turns a run folder into a preset
and back. Names follow keras-hub's BART (keras_hub/src/models/bart/).
"""

import keras
import keras_hub
from keras import ops

from keras_transformer.config import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from keras_transformer.decoding import beam_search, greedy_search
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.model import Transformer

PACKAGE = "keras_transformer"


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerBackbone(keras_hub.models.Backbone):
    """The encoder-decoder of §3 as a keras-hub backbone.

    Inputs: "encoder_token_ids" [B, S] int, "encoder_padding_mask" [B, S] (1 for real
    tokens), "decoder_token_ids" [B, T] int (the target shifted right: BOS first),
    "decoder_padding_mask" [B, T]. Outputs: {"encoder_sequence_output": [B, S, d_model],
    "decoder_sequence_output": [B, T, d_model]}. `token_embedding` is the shared embedding of
    §3.4 (called with `reverse=True` it gives the logits).

    Args: `config`, a `TransformerConfig` (or its dict); `dtype`, the dtype policy.
    """

    def __init__(self, config=None, dtype=None, **kwargs):
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        config = config or TransformerConfig()
        transformer = Transformer(config, dtype=dtype, name="transformer")
        transformer.build()

        def ids(name):
            return keras.Input(shape=(None,), dtype="int32", name=name)

        inputs = {name: ids(name) for name in (
            "encoder_token_ids", "encoder_padding_mask", "decoder_token_ids",
            "decoder_padding_mask")}
        encoder_mask = ops.cast(inputs["encoder_padding_mask"], "bool")
        decoder_mask = ops.cast(inputs["decoder_padding_mask"], "bool")
        memory = transformer.encoder(transformer.embedding(inputs["encoder_token_ids"]),
                                     encoder_mask)
        hidden = transformer.decoder(transformer.embedding(inputs["decoder_token_ids"]), memory,
                                     decoder_mask, encoder_mask)
        super().__init__(inputs=inputs,
                         outputs={"encoder_sequence_output": memory,
                                  "decoder_sequence_output": hidden},
                         dtype=dtype, **kwargs)
        self.config = config
        self.transformer = transformer
        self.token_embedding = transformer.embedding
        # keras-hub's names for the sizes
        self.vocabulary_size, self.num_layers = config.vocab_size, config.num_layers
        self.num_heads, self.hidden_dim = config.num_heads, config.d_model
        self.intermediate_dim = config.d_ff

    def default_lora_layer_names(self):
        """LoRA's targets: the query and value projections of every attention layer (Hu et
        al., 2021), the `Dense` layers named "query" and "value" here."""
        return ["query", "value"]

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerTokenizer(keras_hub.tokenizers.SentencePieceTokenizer):
    """The run's shared SentencePiece vocabulary (vocab.model) as a keras-hub tokenizer,
    with this library's special ids: pad 0, BOS 1 (`start_token_id`), EOS 2
    (`end_token_id`). Text is stripped before it is split, as `keras_transformer.Tokenizer`
    does, so both give the same ids."""

    backbone_cls = TransformerBackbone

    def __init__(self, proto=None, **kwargs):
        self._add_special_token("<s>", "start_token")
        self._add_special_token("</s>", "end_token")
        self._add_special_token("<pad>", "pad_token")
        super().__init__(proto=proto, **kwargs)

    def set_proto(self, proto):
        super().set_proto(proto)
        if proto is not None:
            found = (self.pad_token_id, self.start_token_id, self.end_token_id)
            if found != (PAD_ID, BOS_ID, EOS_ID):
                raise ValueError(f"the vocabulary's <pad>, <s>, </s> ids are {found}, not "
                                 f"{(PAD_ID, BOS_ID, EOS_ID)}: use a vocab.model written by "
                                 "keras-transformer.")

    def tokenize(self, inputs):
        import tensorflow as tf

        if isinstance(inputs, (str, bytes)) or (tf.is_tensor(inputs) and inputs.dtype == tf.string):
            inputs = tf.strings.strip(inputs)
        elif isinstance(inputs, (list, tuple)):
            inputs = tf.strings.strip(tf.constant(inputs, tf.string))
        return super().tokenize(inputs)


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerSeq2SeqLMPreprocessor(keras_hub.models.Seq2SeqLMPreprocessor):
    """Strings to the backbone's inputs, as this library's pipeline builds them: the source
    is its pieces then EOS (no BOS; cut to `encoder_sequence_length` with the EOS kept), the
    decoder input BOS then the target, the labels the target then EOS.

    Call: {"encoder_text": strings, "decoder_text": strings} -> (x, y, sample_weight).
    """

    backbone_cls = TransformerBackbone
    tokenizer_cls = TransformerTokenizer

    def build(self, input_shape):
        super().build(input_shape)
        self.encoder_packer = keras_hub.layers.StartEndPacker(
            start_value=None, end_value=self.tokenizer.end_token_id,
            pad_value=self.tokenizer.pad_token_id,
            sequence_length=self.encoder_sequence_length, return_padding_mask=True)


@keras.saving.register_keras_serializable(package=PACKAGE)
class BeamSearch(keras_hub.samplers.Sampler):
    """The paper's beam search (§6.1) for `TransformerSeq2SeqLM.compile(sampler=...)`: a
    length penalty ((5 + |Y|) / 6)^alpha and finished hypotheses frozen until no live one
    can beat them (`keras_transformer.beam_search`), which keras-hub's `BeamSampler` lacks.
    `max_extra`: at most source length + max_extra tokens. Only `TransformerSeq2SeqLM` runs
    it (a keras-hub sampler is called token by token; this one decodes whole batches)."""

    def __init__(self, beam_size=4, alpha=0.6, max_extra=50, penalty="gnmt", **kwargs):
        super().__init__(**kwargs)
        self.beam_size, self.alpha, self.max_extra, self.penalty = (beam_size, alpha,
                                                                    max_extra, penalty)

    def __call__(self, *args, **kwargs):
        raise TypeError("keras_transformer.hub.BeamSearch decodes whole batches: use it with "
                        "TransformerSeq2SeqLM.compile(sampler=...).")

    def get_config(self):
        return {**super().get_config(), "beam_size": self.beam_size, "alpha": self.alpha,
                "max_extra": self.max_extra, "penalty": self.penalty}


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerSeq2SeqLM(keras_hub.models.Seq2SeqLM):
    """The Transformer as a keras-hub `Seq2SeqLM`: `fit` on strings (through the
    preprocessor), `generate()`, `save_to_preset`, LoRA on `backbone`.

    Call: the backbone's inputs -> logits [B, T, vocab_size] (float32). `generate()` decodes
    with this library's cached search on `backbone.transformer`: `compile(sampler="greedy")`
    gives `keras_transformer.greedy_search`, `compile(sampler=BeamSearch(...))` (the default)
    `keras_transformer.beam_search`, both from BOS (a decoder prompt is not supported) and up
    to source length + `max_extra` tokens, cut to the preprocessor's decoder length.
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs = backbone.input
        hidden = backbone(inputs)["decoder_sequence_output"]
        super().__init__(inputs=inputs, outputs=backbone.token_embedding(hidden, reverse=True),
                         **kwargs)

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto",
                sampler=None, **kwargs):
        """keras-hub's `Seq2SeqLM.compile`, with the paper's defaults: `loss` the
        label-smoothed cross-entropy over real tokens (§5.4), `sampler` `BeamSearch`."""
        if loss == "auto":
            config = self.backbone.config
            loss = LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id)
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
                        sampler=sampler or BeamSearch(), **kwargs)

    def generate_step(self, inputs, stop_token_ids=None):
        transformer = self.backbone.transformer
        mask = ops.cast(inputs["encoder_padding_mask"], "bool")
        source_ids = ops.where(mask, inputs["encoder_token_ids"], transformer.config.pad_id)
        decoder_ids = inputs["decoder_token_ids"]
        if isinstance(self.sampler, BeamSearch):
            sequences = beam_search(
                transformer, source_ids, bos_id=BOS_ID, eos_id=EOS_ID,
                beam_size=self.sampler.beam_size, alpha=self.sampler.alpha,
                max_extra=self.sampler.max_extra, penalty=self.sampler.penalty,
                num_return=1)["sequences"][:, 0]
        elif isinstance(self.sampler, keras_hub.samplers.GreedySampler):
            sequences = greedy_search(transformer, source_ids, bos_id=BOS_ID,
                                      eos_id=EOS_ID)["sequences"]
        else:
            raise ValueError(f"sampler {type(self.sampler).__name__}: TransformerSeq2SeqLM "
                             "decodes with 'greedy' or keras_transformer.hub.BeamSearch.")
        # BOS, then the tokens found, cut or padded to the decoder length asked for
        length = ops.shape(decoder_ids)[1]
        bos = ops.full([ops.shape(sequences)[0], 1], BOS_ID, "int32")
        padding = ops.full([ops.shape(sequences)[0], length], transformer.config.pad_id, "int32")
        tokens = ops.concatenate([bos, ops.cast(sequences, "int32"), padding], axis=1)[:, :length]
        # real tokens: up to and including the first EOS
        ended = ops.cumsum(ops.cast(ops.equal(tokens, EOS_ID), "int32"), axis=1)
        real = (ended - ops.cast(ops.equal(tokens, EOS_ID), "int32")) == 0
        real = ops.logical_and(real, ops.not_equal(tokens, transformer.config.pad_id))
        return {"decoder_token_ids": tokens, "decoder_padding_mask": real}
