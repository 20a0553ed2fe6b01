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


def peer_generate(model, source_ids, new_tokens, sampler):
    """Decodes `new_tokens` tokens for each source with a keras-hub sampler driving the cached
    `TransformerDecoder`s, as keras-hub's seq2seq models do (BART's `_build_cache` and
    `call_with_cache`): the cache is seeded once over the whole prompt, cross-attention keys
    and values included, then extended one position per step. No stop token: fixed work."""
    from keras import ops

    c = model.config
    batch, length = ops.shape(source_ids)[0], new_tokens + 1
    source_mask = source_ids != 0
    memory = model.embed(source_ids)
    for layer in model.encoder_layers:
        memory = layer(memory, padding_mask=source_mask)
    head_dim = c.d_model // c.num_heads
    prompt = ops.concatenate([ops.ones((batch, 1), "int32"),
                              ops.zeros((batch, new_tokens), "int32")], axis=1)

    beams = getattr(sampler, "num_beams", 1)  # the beam sampler folds beams into the batch
    step_memory = ops.repeat(memory, beams, axis=0)
    step_mask = ops.repeat(source_mask, beams, axis=0)

    def decode(tokens, self_caches, cross_caches, index, seed):
        memory_now, mask_now = (memory, source_mask) if seed else (step_memory, step_mask)
        x = model.embedding(tokens) * math.sqrt(c.d_model)
        positions = model.positions(ops.zeros((1, length, c.d_model), x.dtype))
        x = x + ops.slice(positions, [0, index, 0], [1, ops.shape(tokens)[1], c.d_model])
        new_self, new_cross = [], []
        for i, layer in enumerate(model.decoder_layers):
            x, self_cache, cross_cache = layer(
                x, memory_now, encoder_padding_mask=mask_now,
                self_attention_cache=self_caches[i], self_attention_cache_update_index=index,
                cross_attention_cache=cross_caches[i],
                cross_attention_cache_update_index=0 if seed else None)
            new_self.append(self_cache)
            new_cross.append(cross_cache)
        return model.embedding(x, reverse=True), tuple(new_self), tuple(new_cross)

    zeros_self = ops.zeros((batch, 2, length, c.num_heads, head_dim), model.compute_dtype)
    zeros_cross = ops.zeros((batch, 2, ops.shape(source_ids)[1], c.num_heads, head_dim),
                            model.compute_dtype)
    _, self_caches, cross_caches = decode(prompt, (zeros_self,) * c.num_layers,
                                          (zeros_cross,) * c.num_layers, 0, seed=True)

    def next(prompt, cache, index):
        self_caches, cross_caches = cache
        tokens = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
        logits, self_caches, cross_caches = decode(tokens, self_caches, cross_caches,
                                                   index - 1, seed=False)
        return ops.cast(logits[:, 0], "float32"), None, (self_caches, cross_caches)

    mask = ops.concatenate([ops.ones((batch, 1), "bool"),
                            ops.zeros((batch, new_tokens), "bool")], axis=1)
    return sampler(next=next, prompt=prompt, cache=(self_caches, cross_caches), index=1,
                   mask=mask)
