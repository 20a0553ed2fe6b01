"""The encoder stack (§3.1): N identical layers of self-attention and feed-forward."""

import keras

from keras_transformer.attention import MultiHeadAttention, same_segment
from keras_transformer.dropout import Dropout
from keras_transformer.feed_forward import FeedForward, residual
from keras_transformer.stack import LayerStack, layer_norm


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
    """One encoder layer (§3.1): multi-head self-attention, then the feed-forward network, each
    wrapped as LayerNorm(x + Dropout(Sublayer(x))) (or pre-LN with `norm_first`).

    Call: x [B, S, d_model], padding_mask [B, S] bool (True for real tokens), or
    attention_mask [B, S, S] bool (True where token i may attend to token j).
    Returns [B, S, d_model]; with `return_attention_scores`, also the weights [B, h, S, S].
    """

    def __init__(self, num_heads, d_ff, key_dim=None, num_kv_heads=None, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.d_ff, self.key_dim = num_heads, d_ff, key_dim
        self.num_kv_heads, self.dropout_rate = num_kv_heads, dropout
        self.attention_dropout, self.norm_first = attention_dropout, norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(num_heads, key_dim, num_kv_heads,
                                                 attention_dropout, name="self_attention",
                                                 dtype=policy)
        self.feed_forward = FeedForward(d_ff, name="feed_forward", dtype=policy)
        self.attention_norm = layer_norm(layer_norm_epsilon, "attention_norm", policy)
        self.feed_forward_norm = layer_norm(layer_norm_epsilon, "feed_forward_norm", policy)
        self.dropout = Dropout(dropout, dtype=policy)

    def build(self, input_shape):
        self.self_attention.build(input_shape)
        self.feed_forward.build(input_shape)
        self.attention_norm.build(input_shape)
        self.feed_forward_norm.build(input_shape)

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None,
             attention_mask=None):
        mask = attention_mask
        if mask is None and padding_mask is not None:
            mask = padding_mask[:, None, :]
        out = residual(
            x,
            lambda y: self.self_attention(y, attention_mask=mask, training=training,
                                          return_attention_scores=return_attention_scores),
            self.attention_norm, self.dropout, self.norm_first, training)
        x, weights = out if return_attention_scores else (out, None)
        x = residual(x, self.feed_forward, self.feed_forward_norm, self.dropout,
                     self.norm_first, training)
        return (x, weights) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "d_ff": self.d_ff,
                "key_dim": self.key_dim, "num_kv_heads": self.num_kv_heads,
                "dropout": self.dropout_rate, "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first, "layer_norm_epsilon": self.layer_norm_epsilon}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(LayerStack):
    """The encoder (§3.1): positional encoding added to the (scaled) embeddings, dropout,
    then `num_layers` EncoderLayers (plus a final LayerNorm when `norm_first`).

    Call: embeddings [B, S, d_model], padding_mask [B, S] bool. Rows that hold several
    sentences (`make_dataset(batching="concat")`) also pass segment_ids [B, S] (1, 2, ... for
    the sentences of a row, 0 for padding) and positions [B, S] (restarting at 0 in each
    sentence): a token then attends only within its own sentence.
    Returns the memory [B, S, d_model]; with `return_attention_scores`, also a list of
    per-layer weights [B, h, S, S].
    """

    layer_class = EncoderLayer

    def build(self, input_shape):
        self.positions.build(input_shape)
        for layer in self.layers:
            layer.build(input_shape)
        if self.final_norm is not None:
            self.final_norm.build(input_shape)

    def call(self, embeddings, padding_mask=None, return_attention_scores=False, training=None,
             segment_ids=None, positions=None):
        x = embeddings + self.positions(embeddings, positions=positions)
        x = self.dropout(x, training=training)
        mask = None
        if segment_ids is not None:
            mask = same_segment(segment_ids, segment_ids) & padding_mask[:, None, :]
        weights = []
        for layer in self.layers:
            x = layer(x, padding_mask, return_attention_scores=return_attention_scores,
                      training=training, attention_mask=mask)
            if return_attention_scores:
                x, w = x
                weights.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, weights) if return_attention_scores else x
