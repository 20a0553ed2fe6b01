"""The model a user would otherwise assemble from keras-hub: the same dimensions as ours
(shared embedding and output map, post-LN layers, sinusoidal positions, same heads, widths,
vocabulary and dropout), built from `TransformerEncoder`, `TransformerDecoder`,
`ReversibleEmbedding` and `SinePositionEncoding`."""

import math

import keras
import keras_hub


class PeerTransformer(keras.Model):
    """keras-hub layers wired as §3 describes; called like ours, returns float32 logits."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        c = self.config = config
        self.embedding = keras_hub.layers.ReversibleEmbedding(c.vocab_size, c.d_model,
                                                              dtype=self.dtype_policy)
        self.positions = keras_hub.layers.SinePositionEncoding(dtype=self.dtype_policy)
        self.dropout = keras.layers.Dropout(c.dropout)
        self.encoder_layers = [
            keras_hub.layers.TransformerEncoder(c.d_ff, c.num_heads, c.dropout,
                                                layer_norm_epsilon=c.layer_norm_epsilon,
                                                dtype=self.dtype_policy)
            for _ in range(c.num_layers)]
        self.decoder_layers = [
            keras_hub.layers.TransformerDecoder(c.d_ff, c.num_heads, c.dropout,
                                                layer_norm_epsilon=c.layer_norm_epsilon,
                                                dtype=self.dtype_policy)
            for _ in range(c.num_layers)]

    def embed(self, ids):
        x = self.embedding(ids) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.positions(x))

    def call(self, inputs, training=None):
        source, target = inputs["source_ids"], inputs["target_ids"]
        source_mask, target_mask = source != 0, target != 0
        x = self.embed(source)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=source_mask, training=training)
        y = self.embed(target)
        for layer in self.decoder_layers:
            y = layer(y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask,
                      training=training)
        return keras.ops.cast(self.embedding(y, reverse=True), "float32")
