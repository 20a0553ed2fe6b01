"""Cached greedy and beam-search decoding (§6.1), in the graph.

Both run the encoder once per batch, compute the encoder-decoder keys and values once per
layer, and then decode one position per step against preallocated self-attention caches, in a
single `tf.while_loop` with static shapes: they trace under `tf.function`, compile with
`jit_compile=True` and export in a SavedModel. Called eagerly, each runs through a
`tf.function` kept on the model (one per setting), so only the first call traces.

Outputs hold the generated tokens without BOS, ending with EOS when one was produced, then
padding (`config.pad_id`). A hypothesis ends at EOS or at its source's limit,
`source_length + max_extra` (capped by the cache length `source_ids.shape[1] + max_extra` and
by `config.max_length`).
"""

import tensorflow as tf

# Log-probability of an impossible or abandoned hypothesis; finite, so sums never give NaN.
DEAD = -1e9


PENALTIES = ("gnmt", "length")


def length_penalty(length, alpha, penalty="gnmt"):
    """What scores are divided by: "gnmt", the paper's lp(Y) = ((5 + |Y|) / 6) ** alpha (§6.1,
    from Wu et al. 2016, |Y| counting EOS); "length", |Y| ** alpha (|Y| not counting EOS:
    CTranslate2's and fairseq's normalization; the caller passes the length without EOS)."""
    length = tf.cast(length, tf.float32)
    if penalty == "length":
        return tf.pow(length, alpha)
    return tf.pow((5.0 + length) / 6.0, alpha)


def _setup(model, source_ids, max_extra, copies):
    """Encodes the batch once and repeats the memory and its mask for `copies` hypotheses per
    source; returns them with each source's step limit, the cache length and the batch size."""
    source_ids = tf.cast(source_ids, tf.int32)
    source_mask = model.padding_mask(source_ids)
    source_lengths = tf.reduce_sum(tf.cast(source_mask, tf.int32), axis=1)
    if source_ids.shape[1] is not None and isinstance(max_extra, int):
        # A static length keeps every loop shape static (XLA, TPUs).
        max_steps = min(source_ids.shape[1] + max_extra, model.config.max_length)
    else:
        max_steps = tf.minimum(tf.shape(source_ids)[1] + max_extra, model.config.max_length)
    limits = tf.minimum(source_lengths + max_extra, max_steps)
    batch = source_ids.shape[0] if source_ids.shape[0] is not None else tf.shape(source_ids)[0]
    memory = model.encode(source_ids, training=False)
    if not isinstance(copies, int) or copies > 1:
        memory = tf.repeat(memory, copies, axis=0)
        source_mask = tf.repeat(source_mask, copies, axis=0)
    return memory, source_mask, limits, max_steps, batch


def _init_cache(model, memory, max_steps, use_cache):
    """(What the loop carries, what stays fixed): the preallocated self-attention caches and
    the encoder-decoder keys/values, which never change and so stay out of the loop state;
    or (use_cache=False) a buffer of decoder inputs whose whole prefix is run through the
    decoder at every step, and nothing fixed."""
    if not use_cache:
        return {"prefix": tf.zeros([tf.shape(memory)[0], max_steps], tf.int32)}, None
    caches = model.init_cache(memory, max_steps)
    fixed = [{"memory_key": c["memory_key"], "memory_value": c["memory_value"]} for c in caches]
    return _carried(caches), fixed


def _carried(caches):
    """The part of the decoder's per-layer caches that changes every step: the self-attention
    keys and values."""
    return [{"key": c["key"], "value": c["value"]} for c in caches]


def _reorder(cache, parents):
    """The carried cache (per hypothesis), following each hypothesis's parent. The
    encoder-decoder keys/values are the same for every beam of a source: not carried."""
    return tf.nest.map_structure(lambda t: tf.gather(t, parents), cache)


def _step_log_probs(model, tokens, cache, fixed, index, memory, memory_mask, bos_id, scores):
    """Log-probabilities [N, V] of the next token; padding and BOS are never generated."""
    if isinstance(cache, dict):  # no cache: run the decoder over the whole prefix
        prefix = _write_token(cache["prefix"], index, tokens)
        out = model.decoder(model.embedding(prefix[:, :index + 1]), memory,
                            memory_mask=memory_mask, return_attention_scores=scores,
                            training=False)
        hidden, weights = out if scores else (out, None)
        logits, cache = model.embedding.logits(hidden[:, -1]), {"prefix": prefix}
    else:
        full = [{**c, **f} for c, f in zip(cache, fixed)]
        out = model.decode_step(tokens[:, None], full, index, memory_mask,
                                return_attention_scores=scores)
        logits, full, weights = out if scores else out + (None,)
        cache = _carried(full)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    vocab = tf.shape(log_probs)[-1]
    banned = tf.reduce_sum(tf.one_hot([model.config.pad_id, bos_id], vocab), axis=0) > 0
    log_probs = tf.where(banned, DEAD, log_probs)
    attention = None
    if scores:  # cross-attention of the last layer, averaged over heads: [N, S]
        attention = tf.reduce_mean(weights[-1]["cross"][:, :, -1], axis=1)
    return log_probs, cache, attention


def _write_token(sequences, index, tokens):
    """sequences [..., L] with position `index` set to tokens [...]."""
    at = tf.equal(tf.range(tf.shape(sequences)[-1]), index)
    return tf.where(at, tokens[..., None], sequences)


def _write_row(rows, index, row):
    """rows [..., L, S] with row `index` set to row [..., S]."""
    at = tf.equal(tf.range(tf.shape(rows)[-2]), index)
    return tf.where(at[:, None], row[..., None, :], rows)


def _cached(model, kind, settings, fn):
    """Runs `fn` through a tf.function kept on the model when called eagerly."""
    if not tf.executing_eagerly():
        return None
    functions = model.__dict__.setdefault("_keras_transformer_decoders", {})
    key = (kind,) + settings
    if key not in functions:
        functions[key] = tf.function(fn, jit_compile=settings[-1], reduce_retracing=True)
    return functions[key]


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
    settings = (bos_id, eos_id, max_extra, return_attention, use_cache, jit_compile)
    function = _cached(model, "greedy", settings, lambda ids: greedy_search(
        model, ids, bos_id=bos_id, eos_id=eos_id, max_extra=max_extra,
        return_attention=return_attention, use_cache=use_cache))
    if function is not None:
        return function(source_ids)

    memory, memory_mask, limits, max_steps, batch = _setup(model, source_ids, max_extra, 1)
    source_width = tf.shape(memory)[1]
    cache, fixed = _init_cache(model, memory, max_steps, use_cache)

    def body(i, tokens, sequences, scores, finished, attention, cache):
        log_probs, cache, weights = _step_log_probs(model, tokens, cache, fixed, i, memory,
                                                    memory_mask, bos_id, return_attention)
        next_tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        next_tokens = tf.where(finished, model.config.pad_id, next_tokens)
        best = tf.reduce_max(log_probs, axis=-1)
        scores = scores + tf.where(finished, 0.0, best)
        sequences = _write_token(sequences, i, next_tokens)
        if return_attention:
            attention = _write_row(attention, i, tf.where(finished[:, None], 0.0, weights))
        finished = finished | tf.equal(next_tokens, eos_id) | (i + 1 >= limits)
        return i + 1, next_tokens, sequences, scores, finished, attention, cache

    def cond(i, tokens, sequences, scores, finished, attention, cache):
        return (i < max_steps) & ~tf.reduce_all(finished)

    attention = tf.zeros([batch, max_steps, source_width if return_attention else 0])
    empty_seq = tf.fill([batch, max_steps], model.config.pad_id)
    state = (tf.constant(0), tf.fill([batch], bos_id), empty_seq,
             tf.zeros([batch]), tf.zeros([batch], tf.bool), attention, cache)
    _, _, sequences, scores, _, attention, _ = tf.while_loop(cond, body, state)
    result = {"sequences": sequences, "scores": scores}
    if return_attention:
        result["attention"] = attention
    return result


def beam_search(model, source_ids, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_extra=50,
                penalty="gnmt", return_attention=False, jit_compile=False, use_cache=True):
    """Beam search with the GNMT length penalty, as the paper decodes (§6.1: beam 4,
    alpha 0.6, at most input length + 50 tokens, early termination).

    Each step extends every live hypothesis by every token, keeps the 2K best extensions,
    files those that end (EOS or the source's limit) among the K best finished hypotheses,
    scored log P(Y) / lp(|Y|), and continues the K best others. Finished hypotheses are
    frozen. A source stops as soon as no live hypothesis can still beat its K-th finished one
    (its log-probability over the penalty at the source's limit bounds any continuation), and
    the loop stops when every source has.

    With alpha > 0 a beam of 1 can differ from greedy search: after the best token is EOS it
    keeps extending the runner-up while a longer hypothesis could still score higher.
    `penalty="length"` divides by |Y| ** alpha instead (see `length_penalty`), as CTranslate2
    does.
    `return_attention`, `jit_compile` and `use_cache` are as in `greedy_search`.

    `beam_size`, `alpha` and `max_extra` may be tensors (a serving signature takes them per
    request); shapes are then dynamic.

    Returns:
        dict with "sequences" [B, K, L] int32 (n-best, best first; L = S + max_extra capped
        by config.max_length), "scores" [B, K] (length-normalised log-probabilities) and, if
        asked, "attention" [B, K, L, S].
    """
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r}: choose one of {PENALTIES}.")
    settings = (bos_id, eos_id, beam_size, alpha, max_extra, penalty, return_attention,
                use_cache, jit_compile)
    function = _cached(model, "beam", settings, lambda ids: beam_search(
        model, ids, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
        max_extra=max_extra, penalty=penalty, return_attention=return_attention,
        use_cache=use_cache))
    if function is not None:
        return function(source_ids)

    k = beam_size
    memory, memory_mask, limits, max_steps, batch = _setup(model, source_ids, max_extra, k)
    source_width = tf.shape(memory)[1]
    cache, fixed = _init_cache(model, memory, max_steps, use_cache)
    limit_penalty = length_penalty(limits, alpha, penalty)  # the most any continuation gets
    beam_offsets = (tf.range(batch) * k)[:, None]
    attention_width = source_width if return_attention else 0

    def body(i, tokens, alive_seq, alive_log_probs, alive_attention, finished_seq,
             finished_scores, finished_attention, done, cache):
        log_probs, cache, weights = _step_log_probs(model, tokens, cache, fixed, i, memory,
                                                    memory_mask, bos_id, return_attention)
        vocab = tf.shape(log_probs)[-1]
        candidates = alive_log_probs[:, :, None] + tf.reshape(log_probs, [batch, k, vocab])
        top_log_probs, top_index = tf.math.top_k(tf.reshape(candidates, [batch, -1]), 2 * k)
        top_beam, top_tokens = top_index // vocab, top_index % vocab
        top_seq = _write_token(tf.gather(alive_seq, top_beam, batch_dims=1), i, top_tokens)
        top_attention = alive_attention
        if return_attention:
            weights = tf.reshape(weights, [batch, k, -1])
            top_attention = _write_row(tf.gather(alive_attention, top_beam, batch_dims=1), i,
                                   tf.gather(weights, top_beam, batch_dims=1))
        live = top_log_probs > DEAD / 2
        ends = tf.equal(top_tokens, eos_id) | (i + 1 >= limits[:, None])

        # The K best extensions that go on.
        going_on = tf.where(ends | ~live, DEAD, top_log_probs)
        alive_log_probs, keep = tf.math.top_k(going_on, k)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        if return_attention:
            alive_attention = tf.gather(top_attention, keep, batch_dims=1)
        parents = tf.reshape(beam_offsets + tf.gather(top_beam, keep, batch_dims=1), [batch * k])
        cache = _reorder(cache, parents)
        tokens = tf.reshape(tf.gather(top_tokens, keep, batch_dims=1), [batch * k])

        # The K best finished hypotheses so far, the new ones filed among them.
        lengths = i + 1
        if penalty == "length":
            lengths = lengths - tf.cast(tf.equal(top_tokens, eos_id), tf.int32)
        new_scores = tf.where(ends & live,
                              top_log_probs / length_penalty(lengths, alpha, penalty), DEAD)
        finished_scores, best = tf.math.top_k(tf.concat([finished_scores, new_scores], 1), k)
        finished_seq = tf.gather(tf.concat([finished_seq, top_seq], 1), best, batch_dims=1)
        if return_attention:
            finished_attention = tf.gather(
                tf.concat([finished_attention, top_attention], 1), best, batch_dims=1)

        # A source is done once no live hypothesis can beat its K-th finished one; its
        # hypotheses are then frozen.
        best_possible = alive_log_probs[:, 0] / limit_penalty
        done = (done | (finished_scores[:, -1] >= best_possible)
                | (alive_log_probs[:, 0] <= DEAD / 2))
        alive_log_probs = tf.where(done[:, None], DEAD, alive_log_probs)
        return (i + 1, tokens, alive_seq, alive_log_probs, alive_attention, finished_seq,
                finished_scores, finished_attention, done, cache)

    def cond(i, *state):
        return (i < max_steps) & ~tf.reduce_all(state[-2])

    first_beam_only = tf.tile(tf.concat([[0.0], tf.fill([k - 1], DEAD)], 0)[None], [batch, 1])
    empty_seq = tf.fill([batch, k, max_steps], model.config.pad_id)
    empty_attention = tf.zeros([batch, k, max_steps, attention_width])
    state = (tf.constant(0), tf.fill([batch * k], bos_id), empty_seq, first_beam_only,
             empty_attention, empty_seq, tf.fill([batch, k], DEAD), empty_attention,
             tf.zeros([batch], tf.bool), cache)
    state = tf.while_loop(cond, body, state)
    result = {"sequences": state[5], "scores": state[6]}
    if return_attention:
        result["attention"] = state[7]
    return result
