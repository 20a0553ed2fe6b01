"""Attention masks: which keys each query may attend to.

Every mask is boolean, True where attending is allowed, and masks combine with `&`. Attention
adds `MASKED_SCORE` to a masked score before the softmax (§3.2.3: "setting to -inf"), so a
masked key gets weight 0. Three things mask a key:

- padding: a padded position is no token (`padding_mask`, from the ids);
- the future: decoder position i sees positions 0 .. i only (§3.2.3, `causal_mask`);
- another sentence: rows that hold several sentence pairs (`make_dataset(batching="concat")`)
  keep each pair to itself (`same_segment`, from segment ids 1, 2, ... per pair, 0 for padding).
"""

from keras import ops

# Added to masked scores before the softmax: exp() of the sum underflows to exactly 0 in float32
# beside any score that is not masked, and a fully masked row stays finite, never NaN (as -inf
# would make it).
MASKED_SCORE = -1e9


def padding_mask(ids, pad_id):
    """ids [B, T] -> [B, T] bool, True for real tokens."""
    return ops.not_equal(ops.cast(ids, "int32"), pad_id)


def causal_mask(query_length, key_length, start_index=0):
    """[T_q, T_k] bool: query i (at position start_index + i) sees keys 0 .. start_index + i."""
    queries = ops.arange(query_length)[:, None] + ops.cast(start_index, "int32")
    return ops.arange(key_length)[None, :] <= queries


def same_segment(query_segments, key_segments):
    """[B, T_q, T_k] bool: True where query and key belong to the same sentence of a row
    that holds several (segment ids [B, T_q] and [B, T_k])."""
    return ops.equal(query_segments[:, :, None], key_segments[:, None, :])


def encoder_self_attention(padding, segment_ids=None):
    """The encoder's self-attention mask: padding [B, S] bool -> [B, 1, S] (every query sees
    every real key), or [B, S, S] with segment_ids [B, S] (each sentence sees itself)."""
    mask = padding[:, None, :]
    if segment_ids is not None:
        mask = mask & same_segment(segment_ids, segment_ids)
    return mask


def decoder_self_attention(length, padding=None, segment_ids=None):
    """The decoder's masked self-attention over a whole target of `length` positions:
    [1 or B, T, T], causal, and with padding [B, T] and segment_ids [B, T] when given."""
    mask = causal_mask(length, length)[None]
    if padding is not None:
        mask = mask & padding[:, None, :]
    if segment_ids is not None:
        mask = mask & same_segment(segment_ids, segment_ids)
    return mask


def cached_self_attention(query_length, cache_length, start_index):
    """The decoder's self-attention while decoding against a cache of `cache_length` slots:
    [1, T, L], the T new positions (from `start_index`) see the slots written so far."""
    return causal_mask(query_length, cache_length, start_index)[None]


def encoder_decoder_attention(memory_padding, segment_ids=None, memory_segment_ids=None):
    """The encoder-decoder attention mask: memory_padding [B, S] bool -> [B, 1, S], or
    [B, T, S] with the target's segment_ids [B, T] and the source's memory_segment_ids [B, S]
    (a target sentence sees its own source sentence)."""
    mask = memory_padding[:, None, :]
    if segment_ids is not None:
        mask = mask & same_segment(segment_ids, memory_segment_ids)
    return mask
