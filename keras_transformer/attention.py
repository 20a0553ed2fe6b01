"""Scaled dot-product attention (§3.2.1) and multi-head attention (§3.2.2)."""

import keras
from keras import ops

from keras_transformer import cache as decoding_cache
from keras_transformer.dense import Dense
from keras_transformer.dropout import Dropout
from keras_transformer.masks import MASKED_SCORE
from keras_transformer.outputs import layer_output


def scaled_dot_product_attention(query, key, value, mask=None, drop_weights=None):
    """`softmax(Q K^T / sqrt(d_k)) V` (§3.2.1, equation 1).

    Args:
        query: [..., T_q, d_k]. key: [..., T_k, d_k]. value: [..., T_k, d_v]. Leading
            dimensions broadcast (grouped-query attention shares keys across query groups).
        mask: optional boolean, broadcastable to [..., T_q, T_k]; True where a query may
            attend (keras_transformer/masks.py).
        drop_weights: optional callable applied to the weights (attention dropout).

    Returns:
        (outputs [..., T_q, d_v] in the query's dtype, weights [..., T_q, T_k] in float32).
    """
    d_k = query.shape[-1]
    query = query * ops.cast(d_k**-0.5, query.dtype)
    # An einsum, so that no backend is asked for an explicit transpose of the keys (the
    # decoding cache) at every step.
    scores = ops.cast(ops.einsum("...qd,...kd->...qk", query, key), "float32")
    if mask is not None:
        # Added as a bias formed at the mask's own shape (one row of it for all heads): the
        # scores' gradient then passes the add untouched, where a select needed a second
        # select backward, and TensorFlow's select with a broadcast mask is several times
        # slower than its add (README, "The attention mask is added as a bias").
        scores = scores + ops.where(mask, 0.0, MASKED_SCORE)
    weights = ops.softmax(scores, axis=-1)
    applied = weights if drop_weights is None else drop_weights(weights)
    outputs = ops.matmul(ops.cast(applied, value.dtype), value)
    return outputs, weights


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (§3.2.2): h heads, each with its own projections to d_k = d_v,
    concatenated and projected back to d_model by W^O.

    `num_kv_heads` < `num_heads` shares each key/value head across a group of query heads
    (grouped-query attention, a later variant that shrinks the decoding cache).

    Call:
        query [B, T_q, d_model]; value [B, T_k, d_model] (defaults to query: self-attention);
        attention_mask boolean, broadcastable to [B, T_q, T_k], True where attending is allowed.
        real_tokens: a `packing.RealTokens` of a [B, T] padding mask, for self-attention over
        packed rows: query [N, d_model] holds the real tokens of [B, T] (then the zero rows
        `RealTokens` pads them with), the projections run on those rows and the outputs are
        [N, d_model] too (the encoder in training).
        cache: for incremental decoding (keras_transformer/cache.py), a (key, value) pair of
        [B, kv_heads, L, d_k]:
          - with `cache_index`: the preallocated self-attention keys and values; those of the
            T_q new positions are written at cache_index and attention runs over all L slots
            (the mask must hide unwritten slots);
          - without `cache_index`: keys/values computed once by `project_key_value`
            (encoder-decoder attention); `value` is ignored.

    Returns:
        outputs [B, T_q, d_model]; with `cache_index` a `WithCache` (the updated (key, value)
        pair as `cache`), with `return_attention_scores` a `WithWeights` (per-head weights
        [B, h, T_q, T_k] as `weights`), with both a `WithCacheAndWeights`.
    """

    def __init__(self, num_heads, key_dim=None, num_kv_heads=None, dropout=0.0, use_bias=True,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.num_kv_heads = num_kv_heads or num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}.")
        self.drop_weights = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None):
        d_model = query_shape[-1]
        value_width = (value_shape or query_shape)[-1]
        self.head_dim = self.key_dim or d_model // self.num_heads

        def dense(units, name, width):
            layer = Dense(units, use_bias=self.use_bias, name=name, dtype=self.dtype_policy)
            layer.build((None, width))
            return layer

        self.query_dense = dense(self.num_heads * self.head_dim, "query", d_model)
        self.key_dense = dense(self.num_kv_heads * self.head_dim, "key", value_width)
        self.value_dense = dense(self.num_kv_heads * self.head_dim, "value", value_width)
        self.output_dense = dense(d_model, "attention_output", self.num_heads * self.head_dim)

    def _split_heads(self, x, heads, real_tokens=None):
        """[B, T, heads * d_k] -> [B, heads, T, d_k]; from packed rows [N, heads * d_k] with
        `real_tokens` (keras_transformer/packing.py)."""
        if real_tokens is not None:
            return real_tokens.unpack_heads(x, heads)
        x = ops.reshape(x, (*ops.shape(x)[:2], heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _merge_heads(self, x, real_tokens=None):
        """[B, heads, T, d_k] -> [B, T, heads * d_k]; to packed rows [N, heads * d_k] with
        `real_tokens`."""
        if real_tokens is not None:
            return real_tokens.pack_heads(x)
        batch_size, heads, length = ops.shape(x)[:3]
        return ops.reshape(ops.transpose(x, (0, 2, 1, 3)),
                           (batch_size, length, heads * self.head_dim))

    def project_key_value(self, value, real_tokens=None):
        """Keys and values [B, kv_heads, T_k, d_k] of `value` [B, T_k, d_model] (or its
        packed rows [N, d_model] with `real_tokens`)."""
        key = self._split_heads(self.key_dense(value), self.num_kv_heads, real_tokens)
        return key, self._split_heads(self.value_dense(value), self.num_kv_heads, real_tokens)

    def init_cache(self, batch_size, max_length, dtype=None):
        """A zeroed self-attention cache: (key, value), each [B, kv_heads, max_length, d_k]."""
        return decoding_cache.empty(batch_size, self.num_kv_heads, max_length, self.head_dim,
                                    dtype or self.compute_dtype)

    def call(self, query, value=None, attention_mask=None, cache=None, cache_index=None,
             return_attention_scores=False, training=None, real_tokens=None):
        groups = self.num_heads // self.num_kv_heads
        q = self._split_heads(self.query_dense(query), self.num_heads, real_tokens)
        batch_size, query_length = ops.shape(q)[0], ops.shape(q)[2]
        if cache is not None and cache_index is None:
            key, value_heads = cache
        else:
            key, value_heads = self.project_key_value(query if value is None else value,
                                                      real_tokens)
            if cache is not None:
                key = decoding_cache.write(cache[0], key, cache_index)
                value_heads = decoding_cache.write(cache[1], value_heads, cache_index)
                cache = (key, value_heads)
        # Queries [B, h, T, d] against keys and values [B, h, T_k, d]; where groups of query
        # heads share a key head, [B, kv_heads, groups, T, d] against [B, kv_heads, 1, T_k, d]
        # (expand_dims, not [:, :, None]: a strided slice's gradient copies the whole tensor).
        # 4-D where they can be: on CPUs the 5-D products, softmax and gradients were slower
        # (benchmarks/results/attention_rank.md).
        k, v = key, value_heads
        mask = None if attention_mask is None else attention_mask[:, None]
        if groups > 1:
            q = ops.reshape(q, (batch_size, self.num_kv_heads, groups, query_length,
                                self.head_dim))
            k, v = ops.expand_dims(key, 2), ops.expand_dims(value_heads, 2)
            mask = None if mask is None else mask[:, None]
        drop_weights = None
        if self.dropout > 0:
            drop_weights = lambda w: self.drop_weights(w, training=training)  # noqa: E731
        outputs, weights = scaled_dot_product_attention(q, k, ops.cast(v, q.dtype), mask,
                                                        drop_weights)
        outputs = ops.reshape(outputs,
                              (batch_size, self.num_heads, query_length, self.head_dim))
        outputs = self.output_dense(self._merge_heads(outputs, real_tokens))
        if return_attention_scores:
            weights = ops.reshape(weights, (batch_size, self.num_heads, query_length, -1))
        return layer_output(outputs, cache=cache if cache_index is not None else None,
                            weights=weights if return_attention_scores else None)

    def compute_output_shape(self, query_shape, value_shape=None):
        return query_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                "num_kv_heads": self.num_kv_heads, "dropout": self.dropout,
                "use_bias": self.use_bias}
