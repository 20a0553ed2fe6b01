"""The encoder stack (§3.1): N identical layers of self-attention and feed-forward."""

import keras

from keras_transformer import masks
from keras_transformer.outputs import layer_output, split_output
from keras_transformer.stack import LayerStack, StackedLayer


def packs_real_tokens(padding_mask, training, where_faster_only=True):
    """Whether the encoder runs its position-wise sub-layers on the real tokens only, the
    padding left out (keras_transformer/packing.py): in training, on TensorFlow outside
    XLA, where it was measured faster (`packing.pays_here`: CPUs). `where_faster_only=False`
    leaves the machine out."""
    if not (training is True and padding_mask is not None
            and keras.backend.backend() == "tensorflow"):
        return False
    from keras_transformer.packing import pays_here

    return not where_faster_only or pays_here()


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(StackedLayer):
    """One encoder layer (§3.1): multi-head self-attention, then the position-wise
    feed-forward network. Each sub-layer's output is dropped out (§5.4), added to its input
    and normalized: LayerNorm(x + Dropout(Sublayer(x))). With `norm_first` (pre-LN, a later
    variant) the norm comes first instead: x + Dropout(Sublayer(LayerNorm(x))).

    Call: x [B, S, d_model], padding_mask [B, S] bool (True for real tokens), or
    attention_mask [B, S, S] bool (True where token i may attend to token j); with
    real_tokens (a `packing.RealTokens` of the padding), x is [N, d_model], the real tokens
    only (their rows padded as `RealTokens` says), and so is the result.
    Returns [B, S, d_model]; with `return_attention_scores`, a `WithWeights` whose weights are
    [B, h, S, S].
    """

    def __init__(self, num_heads, d_ff, **kwargs):
        super().__init__(num_heads, d_ff, **kwargs)
        # The sub-layers, then their dropouts and norms: the weights' order (and that of
        # Adam's moments in a backup) of files written before keras-transformer 0.2.
        self.self_attention = self.make_attention("self_attention")
        self.feed_forward = self.make_feed_forward()
        self.self_attention_dropout = self.make_dropout("self_attention_dropout")
        self.self_attention_norm = self.make_norm("self_attention_norm")
        self.feed_forward_dropout = self.make_dropout("feed_forward_dropout")
        self.feed_forward_norm = self.make_norm("feed_forward_norm")

    def build(self, input_shape):
        for sublayer in (self.self_attention, self.self_attention_norm, self.feed_forward,
                         self.feed_forward_norm):
            sublayer.build(input_shape)

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None,
             attention_mask=None, real_tokens=None):
        mask = attention_mask
        if mask is None and padding_mask is not None:
            mask = masks.encoder_self_attention(padding_mask)

        # Self-attention: every position attends to every (real) position (§3.2.3).
        y = self.norm_before(x, self.self_attention_norm)
        y, _, weights = split_output(self.self_attention(
            y, attention_mask=mask, return_attention_scores=return_attention_scores,
            training=training, real_tokens=real_tokens))
        x = self.add_and_norm(x, y, self.self_attention_dropout, self.self_attention_norm,
                              training)
        x = self.feed_forward_sublayer(x, training)  # §3.3
        return layer_output(x, weights=weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(LayerStack):
    """The encoder (§3.1): positional encoding added to the (scaled) embeddings, dropout,
    then `num_layers` EncoderLayers (plus a final LayerNorm when `norm_first`).

    Call: embeddings [B, S, d_model], padding_mask [B, S] bool. Rows that hold several
    sentences (`make_dataset(batching="concat")`) also pass segment_ids [B, S] (1, 2, ... for
    the sentences of a row, 0 for padding) and positions [B, S] (restarting at 0 in each
    sentence): a token then attends only within its own sentence.
    Returns the memory [B, S, d_model]; with `return_attention_scores`, a `WithWeights` whose
    weights are a list of per-layer [B, h, S, S]. In training on CPUs (`packs_real_tokens`)
    the layers run on the real tokens only and the memory is zero at padded positions.
    """

    layer_class = EncoderLayer

    def call(self, embeddings, padding_mask=None, return_attention_scores=False, training=None,
             segment_ids=None, positions=None):
        x = embeddings + self.positions(embeddings, positions=positions)
        real_tokens = None
        if packs_real_tokens(padding_mask, training):
            from keras_transformer.packing import RealTokens

            real_tokens = RealTokens(padding_mask)
            x = real_tokens.pack(x)
        x = self.drop_embeddings(x, training=training)
        mask = None
        if padding_mask is not None:
            mask = masks.encoder_self_attention(padding_mask, segment_ids)
        weights = []
        for layer in self.layers:
            x, _, layer_weights = split_output(layer(
                x, return_attention_scores=return_attention_scores, training=training,
                attention_mask=mask, real_tokens=real_tokens))
            weights.append(layer_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if real_tokens is not None:
            x = real_tokens.unpack(x)
        return layer_output(x, weights=weights if return_attention_scores else None)
