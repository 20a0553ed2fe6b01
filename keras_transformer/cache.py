"""The decoding cache: what lets the decoder produce one position per step (§3.2.3, §6.1)
without recomputing the positions before it.

For each decoder layer the cache is one dict of four tensors:

    "key", "value"                [B, kv_heads, L, d_k]  self-attention keys and values of
                                  positions 0 .. L - 1: preallocated zeros, written as each
                                  position is decoded (`write`), so every shape stays static
                                  (XLA, TPUs, SavedModels); the causal mask hides the slots
                                  not written yet.
    "memory_key", "memory_value"  [B, kv_heads, S, d_k]  encoder-decoder keys and values of
                                  the encoder memory, computed once per source batch.

Heads come before positions, so attention reads the cache without a transpose. A search loop
carries only the self-attention half (`carried`), which changes every step, and keeps the
memory half (`fixed`) outside the loop; beam search `reorder`s the carried half to follow each
hypothesis's parent.
"""

import keras
from keras import ops

SELF_ATTENTION = ("key", "value")
MEMORY = ("memory_key", "memory_value")


def empty(batch_size, kv_heads, max_length, head_dim, dtype):
    """Zeroed self-attention keys and values, each [B, kv_heads, max_length, d_k]."""
    zeros = ops.zeros((batch_size, kv_heads, max_length, head_dim), dtype)
    return zeros, zeros


def layer_cache(key, value, memory_key, memory_value):
    """One decoder layer's cache, as laid out above."""
    return {"key": key, "value": value, "memory_key": memory_key, "memory_value": memory_value}


def write(buffer, update, index):
    """`buffer` [B, H, L, d] with `update` [B, H, T, d] written at positions index .. index +
    T - 1, static shapes throughout (XLA, TPUs, SavedModels)."""
    update = ops.cast(update, buffer.dtype)
    if keras.backend.backend() == "tensorflow":
        # TensorFlow's `slice_update` is XLA's DynamicUpdateSlice, which stock TF Serving
        # cannot run outside XLA; a scatter of the T positions is core TF.
        return scatter_write(buffer, update, index)
    return ops.slice_update(buffer, (0, 0, index, 0), update)


def scatter_write(buffer, update, index):
    """`write` as a scatter of core TensorFlow ops (TensorFlow only)."""
    import tensorflow as tf

    shape = tf.shape(update)
    batch, heads, steps = tf.meshgrid(tf.range(shape[0]), tf.range(shape[1]),
                                      tf.range(shape[2]) + tf.cast(index, tf.int32),
                                      indexing="ij")
    indices = tf.reshape(tf.stack([batch, heads, steps], axis=-1), [-1, 3])
    return tf.tensor_scatter_nd_update(buffer, indices, tf.reshape(update, [-1, shape[3]]))


def carried(caches):
    """The part of per-layer caches that changes every step: the self-attention keys, values."""
    return [{name: c[name] for name in SELF_ATTENTION} for c in caches]


def fixed(caches):
    """The part that never changes while decoding: the encoder-decoder keys and values."""
    return [{name: c[name] for name in MEMORY} for c in caches]


def merged(carried_caches, fixed_caches):
    """Whole per-layer caches from their `carried` and `fixed` parts."""
    return [{**c, **f} for c, f in zip(carried_caches, fixed_caches)]


def reorder(carried_caches, parents):
    """The carried caches (or any structure of [N, ...] tensors) of the hypotheses `parents`
    [N] (beam search: each hypothesis continues its parent's). The fixed part is the same for
    every beam of a source."""
    return keras.tree.map_structure(lambda t: ops.take(t, parents, axis=0), carried_caches)
