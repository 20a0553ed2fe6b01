"""The decoder stack (§3.1): N identical layers of masked self-attention, encoder-decoder
attention and feed-forward, with the cache that makes decoding one position per step."""

import keras
import tensorflow as tf

from keras_transformer.attention import MultiHeadAttention, same_segment
from keras_transformer.dropout import Dropout
from keras_transformer.feed_forward import FeedForward, residual
from keras_transformer.stack import LayerStack, layer_norm


def causal_mask(query_length, key_length, start_index=0):
    """[T_q, T_k] bool: query i (at position start_index + i) sees keys 0 .. start_index + i."""
    queries = tf.range(query_length)[:, None] + tf.cast(start_index, tf.int32)
    return tf.range(key_length)[None, :] <= queries


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(keras.layers.Layer):
    """One decoder layer (§3.1): masked multi-head self-attention, encoder-decoder attention
    (queries from the decoder, keys and values from the encoder memory), then the feed-forward
    network, each wrapped as LayerNorm(x + Dropout(Sublayer(x))) (pre-LN with `norm_first`).

    Call:
        x [B, T, d_model]; memory [B, S, d_model]; self_attention_mask bool broadcastable to
        [B, T, T] (or [B, T, L] against a cache of length L); memory_mask [B, 1, S] bool.
        cache: None, or a dict {"key", "value"} ([B, kv_heads, L, d_k], preallocated
        self-attention buffers written at `cache_index`) and {"memory_key", "memory_value"}
        ([B, kv_heads, S, d_k], from `memory_cache`).
    Returns:
        x [B, T, d_model]; then the updated cache if given; then, with
        `return_attention_scores`, {"self": [B, h, T, T or L], "cross": [B, h, T, S]}.
    """

    def __init__(self, num_heads, d_ff, key_dim=None, num_kv_heads=None, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.d_ff, self.key_dim = num_heads, d_ff, key_dim
        self.num_kv_heads, self.dropout_rate = num_kv_heads, dropout
        self.attention_dropout, self.norm_first = attention_dropout, norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        policy = self.dtype_policy

        def attention(name):
            return MultiHeadAttention(num_heads, key_dim, num_kv_heads, attention_dropout,
                                      name=name, dtype=policy)

        self.self_attention = attention("self_attention")
        self.cross_attention = attention("cross_attention")
        self.feed_forward = FeedForward(d_ff, name="feed_forward", dtype=policy)
        self.self_attention_norm = layer_norm(layer_norm_epsilon, "self_attention_norm", policy)
        self.cross_attention_norm = layer_norm(layer_norm_epsilon, "cross_attention_norm", policy)
        self.feed_forward_norm = layer_norm(layer_norm_epsilon, "feed_forward_norm", policy)
        self.dropout = Dropout(dropout, dtype=policy)

    def build(self, input_shape, memory_shape=None):
        self.self_attention.build(input_shape)
        self.cross_attention.build(input_shape, memory_shape or input_shape)
        self.feed_forward.build(input_shape)
        for norm in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward_norm):
            norm.build(input_shape)

    def memory_cache(self, memory):
        """Encoder-decoder keys and values, computed once per source batch."""
        key, value = self.cross_attention.project_key_value(memory)
        return {"memory_key": key, "memory_value": value}

    def call(self, x, memory=None, self_attention_mask=None, memory_mask=None, cache=None,
             cache_index=None, return_attention_scores=False, training=None):
        scores = return_attention_scores

        def self_attention(y):
            return self.self_attention(
                y, attention_mask=self_attention_mask, training=training,
                cache=None if cache is None else (cache["key"], cache["value"]),
                cache_index=cache_index, return_attention_scores=scores)

        def cross_attention(y):
            return self.cross_attention(
                y, memory, attention_mask=memory_mask, training=training,
                cache=None if cache is None else (cache["memory_key"], cache["memory_value"]),
                return_attention_scores=scores)

        out = residual(x, self_attention, self.self_attention_norm, self.dropout,
                       self.norm_first, training)
        out = out if isinstance(out, tuple) else (out,)
        x, extras = out[0], list(out[1:])
        new_cache = None
        if cache is not None:
            key, value = extras.pop(0)
            new_cache = {**cache, "key": key, "value": value}
        self_weights = extras.pop(0) if scores else None

        out = residual(x, cross_attention, self.cross_attention_norm, self.dropout,
                       self.norm_first, training)
        x, cross_weights = out if scores else (out, None)
        x = residual(x, self.feed_forward, self.feed_forward_norm, self.dropout,
                     self.norm_first, training)
        results = (x,)
        if cache is not None:
            results += (new_cache,)
        if scores:
            results += ({"self": self_weights, "cross": cross_weights},)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, input_shape, memory_shape=None):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "d_ff": self.d_ff,
                "key_dim": self.key_dim, "num_kv_heads": self.num_kv_heads,
                "dropout": self.dropout_rate, "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first, "layer_norm_epsilon": self.layer_norm_epsilon}


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
        [B, T, d_model]; then the new caches if given; then, with `return_attention_scores`,
        a list of per-layer {"self", "cross"} weights.
    """

    layer_class = DecoderLayer

    def build(self, input_shape, memory_shape=None):
        self.positions.build(input_shape)
        for layer in self.layers:
            layer.build(input_shape, memory_shape or input_shape)
        if self.final_norm is not None:
            self.final_norm.build(input_shape)

    def init_cache(self, memory, max_length):
        """One cache per layer for decoding up to `max_length` positions against `memory`."""
        batch_size = tf.shape(memory)[0]
        caches = []
        for layer in self.layers:
            key, value = layer.self_attention.init_cache(batch_size, max_length)
            caches.append({"key": key, "value": value, **layer.memory_cache(memory)})
        return caches

    def call(self, embeddings, memory, padding_mask=None, memory_mask=None, cache=None,
             cache_index=None, return_attention_scores=False, training=None, segment_ids=None,
             memory_segment_ids=None, positions=None):
        length = tf.shape(embeddings)[1]
        start = 0 if cache_index is None else cache_index
        x = embeddings + self.positions(embeddings, start_index=start, positions=positions)
        x = self.dropout(x, training=training)
        if cache is None:
            self_mask = causal_mask(length, length)[None]
            if padding_mask is not None:
                self_mask = self_mask & padding_mask[:, None, :]
            if segment_ids is not None:
                self_mask = self_mask & same_segment(segment_ids, segment_ids)
        else:
            self_mask = causal_mask(length, tf.shape(cache[0]["key"])[2], cache_index)[None]
        memory_mask = None if memory_mask is None else memory_mask[:, None, :]
        if segment_ids is not None:
            memory_mask = memory_mask & same_segment(segment_ids, memory_segment_ids)
        new_caches, weights = [], []
        for i, layer in enumerate(self.layers):
            out = layer(x, memory, self_mask, memory_mask,
                        cache=None if cache is None else cache[i], cache_index=cache_index,
                        return_attention_scores=return_attention_scores, training=training)
            out = out if isinstance(out, tuple) else (out,)
            x = out[0]
            if cache is not None:
                new_caches.append(out[1])
            if return_attention_scores:
                weights.append(out[-1])
        if self.final_norm is not None:
            x = self.final_norm(x)
        results = (x,)
        if cache is not None:
            results += (new_caches,)
        if return_attention_scores:
            results += (weights,)
        return results[0] if len(results) == 1 else results
