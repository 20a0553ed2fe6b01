"""The decoder stack (§3.1): N identical layers of masked self-attention, encoder-decoder
attention and feed-forward, with the cache that makes decoding one position per step."""

import keras
from keras import ops

from keras_transformer import cache as decoding_cache
from keras_transformer import masks
from keras_transformer.outputs import layer_output, split_output
from keras_transformer.stack import LayerStack, StackedLayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(StackedLayer):
    """One decoder layer (§3.1): masked multi-head self-attention, encoder-decoder attention
    (queries from the decoder, keys and values from the encoder memory), then the
    position-wise feed-forward network. Each sub-layer's output is dropped out (§5.4), added to
    its input and normalized: LayerNorm(x + Dropout(Sublayer(x))). With `norm_first` (pre-LN,
    a later variant) the norm comes first instead: x + Dropout(Sublayer(LayerNorm(x))).

    Call:
        x [B, T, d_model]; memory [B, S, d_model]; self_attention_mask bool broadcastable to
        [B, T, T] (or [B, T, L] against a cache of length L); memory_mask bool broadcastable
        to [B, T, S]. cache: None, or this layer's decoding cache (keras_transformer/cache.py),
        its self-attention keys and values written at `cache_index`.
    Returns:
        x [B, T, d_model]; with a cache, a `WithCache` holding the updated cache; with
        `return_attention_scores`, a `WithWeights` (or `WithCacheAndWeights`) whose weights
        are {"self": [B, h, T, T or L], "cross": [B, h, T, S]}.
    """

    def __init__(self, num_heads, d_ff, **kwargs):
        super().__init__(num_heads, d_ff, **kwargs)
        # The sub-layers, then their dropouts and norms: the weights' order (and that of
        # Adam's moments in a backup) of files written before keras-transformer 0.2.
        self.self_attention = self.make_attention("self_attention")
        self.cross_attention = self.make_attention("cross_attention")
        self.feed_forward = self.make_feed_forward()
        self.self_attention_dropout = self.make_dropout("self_attention_dropout")
        self.self_attention_norm = self.make_norm("self_attention_norm")
        self.cross_attention_dropout = self.make_dropout("cross_attention_dropout")
        self.cross_attention_norm = self.make_norm("cross_attention_norm")
        self.feed_forward_dropout = self.make_dropout("feed_forward_dropout")
        self.feed_forward_norm = self.make_norm("feed_forward_norm")

    def build(self, x_shape, memory_shape=None):
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape or x_shape)
        for sublayer in (self.self_attention_norm, self.cross_attention_norm,
                         self.feed_forward, self.feed_forward_norm):
            sublayer.build(x_shape)

    def memory_cache(self, memory):
        """Encoder-decoder keys and values of `memory` [B, S, d_model], each
        [B, kv_heads, S, d_k], computed once per source batch."""
        return self.cross_attention.project_key_value(memory)

    def call(self, x, memory=None, self_attention_mask=None, memory_mask=None, cache=None,
             cache_index=None, return_attention_scores=False, training=None):
        with_weights = return_attention_scores

        # Masked self-attention: a position attends to itself and the positions before it
        # (§3.2.3); with a cache, its keys and values are written at `cache_index`.
        y = self.norm_before(x, self.self_attention_norm)
        y, self_cache, self_weights = split_output(self.self_attention(
            y, attention_mask=self_attention_mask,
            cache=None if cache is None else (cache["key"], cache["value"]),
            cache_index=cache_index, return_attention_scores=with_weights, training=training))
        x = self.add_and_norm(x, y, self.self_attention_dropout, self.self_attention_norm,
                              training)

        # Encoder-decoder attention: queries from the decoder, keys and values from the
        # memory (with a cache, computed once per source batch).
        y = self.norm_before(x, self.cross_attention_norm)
        y, _, cross_weights = split_output(self.cross_attention(
            y, memory, attention_mask=memory_mask,
            cache=None if cache is None else (cache["memory_key"], cache["memory_value"]),
            return_attention_scores=with_weights, training=training))
        x = self.add_and_norm(x, y, self.cross_attention_dropout, self.cross_attention_norm,
                              training)

        x = self.feed_forward_sublayer(x, training)  # §3.3

        new_cache = None
        if cache is not None:
            new_cache = decoding_cache.layer_cache(*self_cache, cache["memory_key"],
                                                   cache["memory_value"])
        weights = {"self": self_weights, "cross": cross_weights} if with_weights else None
        return layer_output(x, cache=new_cache, weights=weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(LayerStack):
    """The decoder (§3.1): positional encoding added to the (scaled) target embeddings,
    dropout, then `num_layers` DecoderLayers (plus a final LayerNorm when `norm_first`).

    Call:
        embeddings [B, T, d_model] of the target shifted right; memory [B, S, d_model];
        padding_mask [B, T] and memory_mask [B, S], bool, True for real tokens.
        For incremental decoding: `cache`, a list with one DecoderLayer cache per layer, and
        `cache_index`, the position of the first of the T new steps.
        For rows of several sentences (as in `Encoder`): segment_ids [B, T],
        memory_segment_ids [B, S] and positions [B, T]; a target token then attends to its
        own sentence's earlier tokens and to its own source sentence.
    Returns:
        [B, T, d_model]; with a cache, a `WithCache` holding the new per-layer caches; with
        `return_attention_scores`, a `WithWeights` (or `WithCacheAndWeights`) holding a list
        of per-layer {"self", "cross"} weights.
    """

    layer_class = DecoderLayer

    def init_cache(self, memory, max_length):
        """One cache per layer (keras_transformer/cache.py) for decoding up to `max_length`
        positions against `memory` [B, S, d_model]."""
        batch_size = ops.shape(memory)[0]
        return [decoding_cache.layer_cache(*layer.self_attention.init_cache(batch_size, max_length),
                                           *layer.memory_cache(memory))
                for layer in self.layers]

    def call(self, embeddings, memory, padding_mask=None, memory_mask=None, cache=None,
             cache_index=None, return_attention_scores=False, training=None, segment_ids=None,
             memory_segment_ids=None, positions=None):
        length = ops.shape(embeddings)[1]
        start = 0 if cache_index is None else cache_index
        x = embeddings + self.positions(embeddings, start_index=start, positions=positions)
        x = self.drop_embeddings(x, training=training)
        if cache is None:
            self_mask = masks.decoder_self_attention(length, padding_mask, segment_ids)
        else:
            self_mask = masks.cached_self_attention(length, ops.shape(cache[0]["key"])[2],
                                                    cache_index)
        if memory_mask is not None:
            memory_mask = masks.encoder_decoder_attention(memory_mask, segment_ids,
                                                          memory_segment_ids)
        new_caches, weights = [], []
        for i, layer in enumerate(self.layers):
            x, layer_cache, layer_weights = split_output(layer(
                x, memory, self_mask, memory_mask, cache=None if cache is None else cache[i],
                cache_index=cache_index, return_attention_scores=return_attention_scores,
                training=training))
            new_caches.append(layer_cache)
            weights.append(layer_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return layer_output(x, cache=new_caches if cache is not None else None,
                            weights=weights if return_attention_scores else None)
