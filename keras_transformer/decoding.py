"""Cached greedy and beam-search decoding (§6.1), in the graph.

Both run the encoder once per batch, compute the encoder-decoder keys and values once per
layer, and then decode one position per step against preallocated self-attention caches, in a
single `keras.ops.while_loop` with static shapes, written in `keras.ops` so they run on every
Keras backend: on TensorFlow they trace under `tf.function`, compile with `jit_compile=True`
and export in a SavedModel (a `tf.while_loop`); on JAX they trace under `jax.jit`. Called
eagerly, each runs through a compiled function kept for the model and settings (a
`tf.function`, or a `jax.jit` of the model's variables), so only the first call traces.

Beam search (`beam_search`): each step extends every live hypothesis by every token, keeps the
2K best extensions, files those that end (EOS or the source's limit) among the K best finished
hypotheses, scored log P(Y) / lp(|Y|), and continues the K best others. Finished hypotheses
are frozen. A source stops as soon as no live hypothesis can still beat the last of the N best
finished ones that were asked for (`num_return`, K by default): a live hypothesis's
log-probability over the penalty at the source's limit bounds any continuation. The loop stops
when every source has. With alpha > 0 a beam of 1 can differ from greedy search:
after the best token is EOS it keeps extending the runner-up while a longer hypothesis could
still score higher.

Outputs hold the generated tokens without BOS, ending with EOS when one was produced, then
padding (`config.pad_id`). A hypothesis ends at EOS or at its source's limit,
`source_length + max_extra` (capped by the cache length `source_ids.shape[1] + max_extra` and
by `config.max_length`).
"""

import weakref
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer import cache as decoding_cache
from keras_transformer.outputs import split_output

# Log-probability of an impossible or abandoned hypothesis; finite, so sums never give NaN.
DEAD = -1e9

PENALTIES = ("gnmt", "length")


def length_penalty(length, alpha, penalty="gnmt"):
    """What scores are divided by: "gnmt", the paper's lp(Y) = ((5 + |Y|) / 6) ** alpha (§6.1,
    from Wu et al. 2016, |Y| counting EOS); "length", |Y| ** alpha (|Y| not counting EOS:
    CTranslate2's and fairseq's normalization; the caller passes the length without EOS;
    an empty hypothesis counts as 1). length: int tensor of any shape -> float32 of the same
    shape."""
    length = ops.cast(length, "float32")
    if penalty == "length":
        # A hypothesis that is EOS alone has no tokens: scored as one token, not divided by
        # 0 ** alpha (which gives -inf or NaN).
        return ops.power(ops.maximum(length, 1.0), alpha)
    return ops.power((5.0 + length) / 6.0, alpha)


# Eager calls run through one compiled function per model and settings, so only the first
# traces: {model: {(search, settings): function}}, forgotten with the model.
_TRACED = weakref.WeakKeyDictionary()


def _is_tensor(value):
    return keras.backend.backend() == "tensorflow" and ops.is_tensor(value)


def _eager(source_ids):
    """Whether a search was called from outside a traced function (which it then runs in)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly()
    if backend == "jax":
        import jax

        return not isinstance(source_ids, jax.core.Tracer)
    return False  # PyTorch and NumPy run op by op


def _traced(search, model, settings):
    """`search` (greedy_search or beam_search) of `model` with keyword `settings`, as the
    compiled function kept for them; call it with the source ids. On TensorFlow, settings
    given as tensors (a `beam_size` of tf.constant(2), say) are arguments of the function, not
    part of its key: a tensor cannot key a dict, and its value may change from call to call.
    On JAX the function takes the model's variables as arguments (`jax.jit` of a stateless
    call), so training between calls is seen."""
    tensors = {name: value for name, value in settings.items() if _is_tensor(value)}
    fixed = {name: value for name, value in settings.items() if name not in tensors}
    functions = _TRACED.setdefault(model, {})
    key = (search.__name__, tuple(sorted(fixed.items())),
           tuple(sorted((name, value.dtype.name) for name, value in tensors.items())))
    model_ref = weakref.ref(model)  # the function must not keep the model alive
    if keras.backend.backend() == "jax":
        import jax

        if key not in functions:
            def stateless(values, ids):
                model = model_ref()
                with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                    return search(model, ids, **fixed)

            functions[key] = jax.jit(stateless)
        return lambda ids: functions[key]([v.value for v in model.variables], ids)
    import tensorflow as tf

    if key not in functions:
        # autograph=False: each search is one keras.ops.while_loop already, so converting
        # its Python would only add tracing time.
        functions[key] = tf.function(
            lambda ids, given: search(model_ref(), ids, **fixed, **given),
            jit_compile=fixed["jit_compile"], reduce_retracing=True, autograph=False)
    return lambda ids: functions[key](ids, tensors)


def _setup(model, source_ids, max_extra, copies):
    """Encodes the batch once and repeats the memory [B * copies, S, d_model] and its mask
    for `copies` hypotheses per source; returns them with each source's step limit [B], the
    cache length and the batch size B."""
    source_ids = ops.cast(source_ids, "int32")
    source_mask = model.padding_mask(source_ids)
    source_lengths = ops.sum(ops.cast(source_mask, "int32"), axis=1)
    if source_ids.shape[1] is not None and isinstance(max_extra, int):
        # A static length keeps every loop shape static (XLA, TPUs).
        max_steps = min(source_ids.shape[1] + max_extra, model.config.max_length)
    else:
        max_steps = ops.minimum(ops.shape(source_ids)[1] + max_extra, model.config.max_length)
    limits = ops.minimum(source_lengths + max_extra, max_steps)
    batch = ops.shape(source_ids)[0]
    memory = model.encode(source_ids, training=False)
    if not isinstance(copies, int) or copies > 1:
        memory = ops.repeat(memory, copies, axis=0)
        source_mask = ops.repeat(source_mask, copies, axis=0)
    return memory, source_mask, limits, max_steps, batch


def _decoder_state(model, memory, max_steps, use_cache):
    """(carried, fixed): the decoding cache's carried part, which the loop carries, and its
    fixed part, which stays outside the loop (keras_transformer/cache.py). Without a cache:
    a buffer [N, max_steps] of the decoder inputs so far, run whole at every step, and None."""
    if not use_cache:
        return ops.zeros((ops.shape(memory)[0], max_steps), "int32"), None
    length = max_steps
    if decoding_cache.can_grow(max_steps):  # `_next_log_probs` grows it as needed
        length = ops.minimum(max_steps, decoding_cache.FIRST_LENGTH)
    caches = model.init_cache(memory, length)
    return decoding_cache.carried(caches), decoding_cache.fixed(caches)


def _next_log_probs(model, tokens, carried, fixed, index, max_steps, memory, memory_mask,
                    bos_id, return_attention):
    """Log-probabilities [N, V] of the token after `tokens` [N] (at position `index` of at
    most `max_steps`), the new carried state and, with `return_attention`, the last layer's
    cross-attention averaged over heads [N, S]. Padding and BOS are never generated."""
    if fixed is None:  # no cache: run the decoder over the whole prefix
        prefix = _write_token(carried, index, tokens)
        hidden, _, weights = split_output(model.decoder(
            model.embedding(prefix[:, :index + 1]), memory, memory_mask=memory_mask,
            return_attention_scores=return_attention, training=False))
        logits, carried = model.embedding.logits(hidden[:, -1], float32_product=True), prefix
    else:
        if decoding_cache.can_grow(max_steps):
            carried = decoding_cache.with_room(carried, index, max_steps)
        logits, caches, weights = split_output(model.decode_step(
            tokens[:, None], decoding_cache.merged(carried, fixed), index, memory_mask,
            return_attention_scores=return_attention))
        carried = decoding_cache.carried(caches)
    log_probs = ops.log_softmax(logits, axis=-1)
    vocab = ops.arange(ops.shape(log_probs)[-1])
    banned = (vocab == model.config.pad_id) | (vocab == bos_id)
    log_probs = ops.where(banned, DEAD, log_probs)
    attention = None
    if return_attention:
        attention = ops.mean(weights[-1]["cross"][:, :, -1], axis=1)
    return log_probs, carried, attention


def _write_token(sequences, index, tokens):
    """sequences [..., L] with position `index` set to tokens [...]."""
    at = ops.arange(ops.shape(sequences)[-1]) == index
    return ops.where(at, tokens[..., None], sequences)


def _write_row(rows, index, row):
    """rows [..., L, S] with row `index` set to row [..., S]."""
    at = ops.arange(ops.shape(rows)[-2]) == index
    return ops.where(at[:, None], row[..., None, :], rows)


def _take_beams(x, beams):
    """x [B, K, ...] -> [B, M, ...]: for each source b, its hypotheses beams[b] [M]. (A gather
    of flat rows: `take_along_axis` would broadcast and, on TensorFlow, transpose x.)"""
    batch, k = ops.shape(x)[0], ops.shape(x)[1]
    rest = ops.shape(x)[2:]
    rows = ops.reshape(beams + ops.arange(batch)[:, None] * k, (-1,))
    taken = ops.take(ops.reshape(x, (-1, *rest)), rows, axis=0)
    return ops.reshape(taken, (batch, ops.shape(beams)[1], *rest))


class GreedyState(NamedTuple):
    """Greedy search's loop state (B sources, L steps, S source positions)."""

    step: Any  # the position being decoded
    tokens: Any  # [B] the last tokens
    sequences: Any  # [B, L] the tokens so far, then padding
    scores: Any  # [B] the sum of their log-probabilities
    finished: Any  # [B] bool: EOS produced or the limit reached
    attention: Any  # [B, L, S] (S = 0 unless asked for)
    carried: Any  # the decoding cache's carried part (or the prefix without a cache)


def greedy_search(model, source_ids, *, bos_id, eos_id, max_extra=50,
                  return_attention=False, jit_compile=False, use_cache=True):
    """Greedy decoding: the most probable token at each step, until EOS or the limit.

    Args:
        model: a `Transformer`. source_ids: [B, S] int, padded with `config.pad_id`.
        return_attention: also return the cross-attention of the last decoder layer,
            averaged over heads, for each generated token.
        jit_compile: for eager calls, compile the decoding function with XLA.
        use_cache: False runs the decoder over the whole prefix at every step instead (slower;
            for comparison; not compilable with XLA, whose shapes must not vary).
    Returns:
        dict with "sequences" [B, L] int32 (L = S + max_extra, capped by config.max_length),
        "scores" [B] (the sum of the tokens' log-probabilities) and, if asked, "attention"
        [B, L, S].
    """
    if _eager(source_ids):
        return _traced(greedy_search, model, dict(
            bos_id=bos_id, eos_id=eos_id, max_extra=max_extra, return_attention=return_attention,
            jit_compile=jit_compile, use_cache=use_cache))(source_ids)

    memory, memory_mask, limits, max_steps, batch = _setup(model, source_ids, max_extra, 1)
    carried, fixed = _decoder_state(model, memory, max_steps, use_cache)

    def body(state):
        i = state.step
        log_probs, carried, weights = _next_log_probs(
            model, state.tokens, state.carried, fixed, i, max_steps, memory, memory_mask,
            bos_id, return_attention)
        finished = state.finished
        tokens = ops.where(finished, model.config.pad_id,
                           ops.cast(ops.argmax(log_probs, axis=-1), "int32"))
        attention = state.attention
        if return_attention:
            attention = _write_row(attention, i, ops.where(finished[:, None], 0.0, weights))
        return (GreedyState(
            step=i + 1, tokens=tokens, sequences=_write_token(state.sequences, i, tokens),
            scores=state.scores + ops.where(finished, 0.0, ops.max(log_probs, axis=-1)),
            finished=finished | (tokens == eos_id) | (i + 1 >= limits),
            attention=attention, carried=carried),)

    def cond(state):
        return (state.step < max_steps) & ~ops.all(state.finished)

    attention_width = ops.shape(memory)[1] if return_attention else 0
    state = GreedyState(
        step=ops.convert_to_tensor(0, "int32"), tokens=ops.full((batch,), bos_id, "int32"),
        sequences=ops.full((batch, max_steps), model.config.pad_id, "int32"),
        scores=ops.zeros((batch,)), finished=ops.zeros((batch,), "bool"),
        attention=ops.zeros((batch, max_steps, attention_width)), carried=carried)
    (state,) = ops.while_loop(cond, body, (state,))
    result = {"sequences": state.sequences, "scores": state.scores}
    if return_attention:
        result["attention"] = state.attention
    return result


class BeamState(NamedTuple):
    """Beam search's loop state (B sources, K beams, L steps, S source positions)."""

    step: Any  # the position being decoded
    tokens: Any  # [B * K] the live hypotheses' last tokens
    alive_seq: Any  # [B, K, L] the live hypotheses
    alive_log_probs: Any  # [B, K] their log-probabilities (DEAD: none)
    alive_attention: Any  # [B, K, L, S] (S = 0 unless asked for)
    finished_seq: Any  # [B, K, L] the K best finished hypotheses, best first
    finished_scores: Any  # [B, K] their length-normalised scores (DEAD: none)
    finished_attention: Any  # [B, K, L, S]
    done: Any  # [B] bool: no live hypothesis can beat the K-th finished one
    carried: Any  # the live hypotheses' decoding cache, carried part (or their prefix)


class Extensions(NamedTuple):
    """The 2K best one-token extensions of a source's live hypotheses (beam search)."""

    log_probs: Any  # [B, 2K]
    beams: Any  # [B, 2K] the hypothesis each extends
    tokens: Any  # [B, 2K] the token each adds
    sequences: Any  # [B, 2K, L]
    attention: Any  # [B, 2K, L, S] (S = 0 unless asked for)
    ends: Any  # [B, 2K] bool: EOS, or the source's limit reached
    live: Any  # [B, 2K] bool: not an extension of a dead hypothesis


def _extend(state, log_probs, weights, batch, k, limits, eos_id, return_attention):
    """The `Extensions` of `state`'s live hypotheses by next-token `log_probs` [B * K, V]."""
    vocab = ops.shape(log_probs)[-1]
    candidates = state.alive_log_probs[:, :, None] + ops.reshape(log_probs, (batch, k, vocab))
    top_log_probs, top_index = ops.top_k(ops.reshape(candidates, (batch, -1)), 2 * k)
    top_index = ops.cast(top_index, "int32")
    beams, tokens = top_index // vocab, top_index % vocab
    sequences = _write_token(_take_beams(state.alive_seq, beams), state.step, tokens)
    attention = state.alive_attention
    if return_attention:
        weights = ops.reshape(weights, (batch, k, -1))
        attention = _write_row(_take_beams(attention, beams), state.step,
                               _take_beams(weights, beams))
    return Extensions(top_log_probs, beams, tokens, sequences, attention,
                      ends=(tokens == eos_id) | (state.step + 1 >= limits[:, None]),
                      live=top_log_probs > DEAD / 2)


def _file_finished(state, top, k, alpha, penalty, eos_id, return_attention):
    """(sequences, scores, attention) of the K best finished hypotheses: those of `state`
    and the extensions in `top` that end, scored log P(Y) / lp(|Y|)."""
    lengths = state.step + 1
    if penalty == "length":
        lengths = lengths - ops.cast(top.tokens == eos_id, "int32")
    new_scores = ops.where(top.ends & top.live,
                          top.log_probs / length_penalty(lengths, alpha, penalty), DEAD)
    scores, best = ops.top_k(ops.concatenate([state.finished_scores, new_scores], 1), k)
    best = ops.cast(best, "int32")
    sequences = _take_beams(ops.concatenate([state.finished_seq, top.sequences], 1), best)
    attention = state.finished_attention
    if return_attention:
        attention = _take_beams(ops.concatenate([attention, top.attention], 1), best)
    return sequences, scores, attention


def _first_beam_state(batch, k, max_steps, attention_width, bos_id, pad_id, carried):
    """The state before the first step: one live hypothesis (BOS) per source, none finished."""
    empty_seq = ops.full((batch, k, max_steps), pad_id, "int32")
    empty_attention = ops.zeros((batch, k, max_steps, attention_width))
    first_beam_only = ops.where(ops.arange(k) == 0, 0.0, DEAD)[None] + ops.zeros((batch, 1))
    return BeamState(
        step=ops.convert_to_tensor(0, "int32"), tokens=ops.full((batch * k,), bos_id, "int32"),
        alive_seq=empty_seq, alive_log_probs=first_beam_only, alive_attention=empty_attention,
        finished_seq=empty_seq, finished_scores=ops.full((batch, k), DEAD, "float32"),
        finished_attention=empty_attention, done=ops.zeros((batch,), "bool"), carried=carried)


def beam_search(model, source_ids, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_extra=50,
                penalty="gnmt", num_return=None, return_attention=False, jit_compile=False,
                use_cache=True):
    """Beam search as the paper decodes (§6.1: beam 4, alpha 0.6, at most input length + 50
    tokens, early termination; see the module docstring). `penalty`: "gnmt" (the paper's) or
    "length" (CTranslate2's; see `length_penalty`); `num_return`: how many of the best
    hypotheses are wanted, N in 1..K (default K): a source stops once its N best are settled,
    so N = 1 stops sooner than K and returns the same best hypothesis; `return_attention`,
    `jit_compile` and `use_cache` as in `greedy_search`. `beam_size`, `alpha`, `max_extra`
    and `num_return` may be tensors (a serving signature takes them per request); shapes are
    then dynamic.

    Returns: dict with "sequences" [B, N, L] int32 (n-best, best first; L = S + max_extra
    capped by config.max_length), "scores" [B, N] (length-normalised log-probabilities) and,
    if asked, "attention" [B, N, L, S].
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r}: choose one of {PENALTIES}.")
    if isinstance(num_return, int) and isinstance(beam_size, int) and not (
            1 <= num_return <= beam_size):
        raise ValueError(f"num_return={num_return}: ask for 1 to beam_size={beam_size} "
                         "hypotheses.")
    if _eager(source_ids):
        return _traced(beam_search, model, dict(
            bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_extra=max_extra,
            penalty=penalty, num_return=num_return, return_attention=return_attention,
            jit_compile=jit_compile, use_cache=use_cache))(source_ids)

    k = beam_size
    n = k if num_return is None else num_return  # the hypotheses asked for, best first
    memory, memory_mask, limits, max_steps, batch = _setup(model, source_ids, max_extra, k)
    carried, fixed = _decoder_state(model, memory, max_steps, use_cache)
    limit_penalty = length_penalty(limits, alpha, penalty)  # the most any continuation gets
    beam_offsets = (ops.arange(batch) * k)[:, None]

    def body(state):  # one step: every live hypothesis extended by one token
        log_probs, carried, weights = _next_log_probs(
            model, state.tokens, state.carried, fixed, state.step, max_steps, memory,
            memory_mask, bos_id, return_attention)
        top = _extend(state, log_probs, weights, batch, k, limits, eos_id, return_attention)
        # The K best extensions that go on, and the K best finished hypotheses; a source is
        # done (its hypotheses frozen) once no live one can beat its n-th finished one: the n
        # best can no longer change.
        going_on = ops.where(top.ends | ~top.live, DEAD, top.log_probs)
        alive_log_probs, keep = ops.top_k(going_on, k)
        keep = ops.cast(keep, "int32")
        parents = ops.reshape(beam_offsets + _take_beams(top.beams, keep), (batch * k,))
        finished_seq, finished_scores, finished_attention = _file_finished(
            state, top, k, alpha, penalty, eos_id, return_attention)
        settled = ops.take(finished_scores, n - 1, axis=1) >= alive_log_probs[:, 0] / limit_penalty
        done = state.done | settled | (alive_log_probs[:, 0] <= DEAD / 2)
        return (BeamState(
            step=state.step + 1,
            tokens=ops.reshape(_take_beams(top.tokens, keep), (batch * k,)),
            alive_seq=_take_beams(top.sequences, keep),
            alive_log_probs=ops.where(done[:, None], DEAD, alive_log_probs),
            alive_attention=(_take_beams(top.attention, keep) if return_attention
                             else state.alive_attention),
            finished_seq=finished_seq, finished_scores=finished_scores,
            finished_attention=finished_attention, done=done,
            carried=decoding_cache.reorder(carried, parents)),)

    def cond(state):
        return (state.step < max_steps) & ~ops.all(state.done)

    attention_width = ops.shape(memory)[1] if return_attention else 0
    state = _first_beam_state(batch, k, max_steps, attention_width, bos_id, model.config.pad_id,
                              carried)
    (state,) = ops.while_loop(cond, body, (state,))
    result = {"sequences": state.finished_seq[:, :n], "scores": state.finished_scores[:, :n]}
    if return_attention:
        result["attention"] = state.finished_attention[:, :n]
    return result
