"""What a layer returns when asked for more than its output.

Attention, the encoder and decoder layers and stacks, and the model's `encode`, `decode` and
`decode_step` return their output tensor alone by default. Asked for the decoding cache
(`cache_index` given) or for the attention weights (`return_attention_scores=True`), they
return one of these named tuples instead, read by name (`result.cache`) or unpacked as before
(`outputs, weights = layer(..., return_attention_scores=True)`).
"""

from typing import Any, NamedTuple


class WithWeights(NamedTuple):
    """The output and the attention weights."""

    outputs: Any
    weights: Any


class WithCache(NamedTuple):
    """The output and the updated decoding cache (see keras_transformer/cache.py)."""

    outputs: Any
    cache: Any


class WithCacheAndWeights(NamedTuple):
    """The output, the updated decoding cache and the attention weights."""

    outputs: Any
    cache: Any
    weights: Any


def layer_output(outputs, cache=None, weights=None):
    """`outputs` alone, or with the `cache` and `weights` that were asked for (not None)."""
    if cache is not None and weights is not None:
        return WithCacheAndWeights(outputs, cache, weights)
    if cache is not None:
        return WithCache(outputs, cache)
    if weights is not None:
        return WithWeights(outputs, weights)
    return outputs


def split_output(result):
    """(outputs, cache or None, weights or None) of what a layer returned."""
    if isinstance(result, tuple):
        return result[0], getattr(result, "cache", None), getattr(result, "weights", None)
    return result, None, None
