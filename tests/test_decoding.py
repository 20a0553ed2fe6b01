import itertools

import numpy as np
import pytest
import tensorflow as tf
from conftest import random_ids, small_config

import keras_transformer as kt
from keras_transformer.decoding import beam_search, greedy_search

BOS, EOS = 1, 2


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(3)
    model = kt.Transformer(small_config(vocab_size=30))
    model.build()
    return model


@pytest.fixture(scope="module")
def tiny_vocab_model():
    """Vocabulary of 5 (pad, BOS, EOS and two words), with sharp distributions."""
    tf.keras.utils.set_random_seed(7)
    model = kt.Transformer(small_config(vocab_size=5, d_model=16, num_heads=2))
    model.build()
    model.embedding.embeddings.assign(model.embedding.embeddings * 4)
    return model


def test_cached_decoding_equals_full_forward_pass(model, rng):
    source = tf.constant(random_ids(rng, 3, 7, 30))
    target = np.concatenate([np.full((3, 1), BOS), random_ids(rng, 3, 8, 30, min_length=8)], 1)
    full = model({"source_ids": source, "target_ids": tf.constant(target)})
    memory = model.encode(source)
    cache = model.init_cache(memory, 12)
    for step in range(target.shape[1]):
        logits, cache = model.decode_step(tf.constant(target[:, step:step + 1]), cache, step,
                                          model.padding_mask(source))
        np.testing.assert_allclose(logits, full[:, step], atol=1e-4)


def penalty_by_hand(tokens, alpha, penalty):
    """gnmt: ((5 + |Y|) / 6) ** alpha, |Y| counting EOS (§6.1); length: |Y| ** alpha with |Y|
    not counting EOS, an empty hypothesis counted as one token (CTranslate2's
    `length_penalty`)."""
    if penalty == "gnmt":
        return ((5 + len(tokens)) / 6) ** alpha
    return max(len(tokens) - (tokens[-1] == EOS), 1) ** alpha


def enumerate_hypotheses(model, source, limit, alpha, penalty="gnmt"):
    """Every hypothesis (EOS-terminated, or cut at `limit` tokens) scored by full forward
    passes: log P(Y) / lp(|Y|), with the same log-softmax over the whole vocabulary."""
    words = [3, 4]
    hypotheses = []
    for n in range(1, limit + 1):
        last = [EOS] + (words if n == limit else [])
        for prefix in itertools.product(words, repeat=n - 1):
            for end in last:
                hypotheses.append(list(prefix) + [end])
    results = []
    for tokens in hypotheses:
        target = tf.constant([[BOS] + tokens[:-1]])
        logits = model({"source_ids": tf.constant([source]), "target_ids": target})
        log_probs = tf.nn.log_softmax(logits[0]).numpy()
        total = sum(log_probs[t, tok] for t, tok in enumerate(tokens))
        results.append((total / penalty_by_hand(tokens, alpha, penalty), tokens))
    return sorted(results, key=lambda r: -r[0])


@pytest.mark.parametrize("alpha, penalty", [(0.6, "gnmt"), (0.0, "gnmt"), (1.5, "gnmt"),
                                            (0.6, "length"), (1.5, "length")])
def test_wide_beam_equals_exhaustive_enumeration(tiny_vocab_model, alpha, penalty):
    """Every hypothesis kept and ranked as scored by hand. With penalty="length" that
    includes EOS alone (issue 23, item 13: it was divided by 0 ** alpha, -inf)."""
    sources = [[3, 4, 0], [4, 0, 0]]  # limits: 2 + 2 and 1 + 2 tokens
    beam = 12  # wide enough that nothing is pruned: the search must be exact
    result = beam_search(tiny_vocab_model, tf.constant(sources), bos_id=BOS, eos_id=EOS,
                         beam_size=beam, alpha=alpha, max_extra=2, penalty=penalty)
    assert np.all(np.isfinite(result["scores"]))
    for row, source in enumerate(sources):
        limit = sum(t != 0 for t in source) + 2
        expected = enumerate_hypotheses(tiny_vocab_model, source, limit, alpha, penalty)[:beam]
        found = [(float(score), [int(t) for t in seq if t != 0])
                 for score, seq in zip(result["scores"][row], result["sequences"][row])
                 if score > -1e8]
        assert [tokens for _, tokens in found] == [tokens for _, tokens in expected][:len(found)]
        np.testing.assert_allclose([s for s, _ in found], [s for s, _ in expected][:len(found)],
                                   rtol=1e-4)
        assert found[0][1] == expected[0][1]


@pytest.mark.parametrize("alpha", [0.6, 1.5])
def test_fewer_hypotheses_asked_for_are_the_same_best_ones(tiny_vocab_model, model, rng, alpha):
    """num_return=N stops a source once its N best are settled: they are the N best of the
    exhaustive enumeration (a beam that prunes nothing), and with N = 1 a beam that prunes
    finds the best of the full n-best list."""
    sources = [[3, 4, 0], [4, 0, 0]]  # limits: 2 + 2 and 1 + 2 tokens
    enumerated = [enumerate_hypotheses(tiny_vocab_model, source, sum(t != 0 for t in source) + 2,
                                       alpha) for source in sources]
    for n in (1, 3):
        result = beam_search(tiny_vocab_model, tf.constant(sources), bos_id=BOS, eos_id=EOS,
                             beam_size=12, alpha=alpha, max_extra=2, num_return=n)
        assert result["sequences"].shape[1] == n
        for row, expected in enumerate(enumerated):
            assert [[int(t) for t in seq if t != 0] for seq in result["sequences"][row]] == \
                [tokens for _, tokens in expected[:n]]
            np.testing.assert_allclose(result["scores"][row], [s for s, _ in expected[:n]],
                                       rtol=1e-4)
    pruned = tf.constant(random_ids(rng, 8, 6, 30))
    full = beam_search(model, pruned, bos_id=BOS, eos_id=EOS, beam_size=4, alpha=alpha,
                       max_extra=6)
    first = beam_search(model, pruned, bos_id=BOS, eos_id=EOS, beam_size=4, alpha=alpha,
                        max_extra=6, num_return=1)
    np.testing.assert_array_equal(first["sequences"], full["sequences"][:, :1])
    np.testing.assert_allclose(first["scores"], full["scores"][:, :1], rtol=1e-5)
    with pytest.raises(ValueError, match="num_return=5"):
        beam_search(model, pruned, bos_id=BOS, eos_id=EOS, beam_size=4, num_return=5)


def test_paper_beam_finds_a_scored_hypothesis(tiny_vocab_model):
    source = [3, 4, 0]
    result = beam_search(tiny_vocab_model, tf.constant([source]), bos_id=BOS, eos_id=EOS,
                         max_extra=2)
    scored = {tuple(tokens): score for score, tokens in
              enumerate_hypotheses(tiny_vocab_model, source, 4, 0.6)}
    best = tuple(int(t) for t in result["sequences"][0, 0] if t != 0)
    np.testing.assert_allclose(float(result["scores"][0, 0]), scored[best], rtol=1e-4)
    assert scored[best] <= max(scored.values()) + 1e-6


def test_beam_of_one_equals_greedy(model, rng):
    source = tf.constant(random_ids(rng, 4, 6, 30))
    greedy = greedy_search(model, source, bos_id=BOS, eos_id=EOS, max_extra=8)
    beam = beam_search(model, source, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.0,
                       max_extra=8)
    np.testing.assert_array_equal(beam["sequences"][:, 0], greedy["sequences"])
    np.testing.assert_allclose(beam["scores"][:, 0], greedy["scores"], rtol=1e-5)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_equals_one_source_at_a_time(model, rng, search):
    sources = random_ids(rng, 4, 6, 30)
    decode = (lambda ids: greedy_search(model, ids, bos_id=BOS, eos_id=EOS, max_extra=5)) \
        if search == "greedy" else \
        (lambda ids: beam_search(model, ids, bos_id=BOS, eos_id=EOS, max_extra=5))
    batch = decode(tf.constant(sources))
    for row in range(len(sources)):
        length = int((sources[row] != 0).sum())
        alone = decode(tf.constant(sources[row:row + 1, :length]))
        width = alone["sequences"].shape[-1]
        np.testing.assert_array_equal(batch["sequences"][row][..., :width],
                                      alone["sequences"][0])
        assert np.all(batch["sequences"][row][..., width:] == 0)
        np.testing.assert_allclose(batch["scores"][row], alone["scores"][0], rtol=1e-4,
                                   atol=1e-4)


def test_limits_and_eos(model, rng):
    sources = random_ids(rng, 6, 5, 30)
    max_extra = 3
    for result in (greedy_search(model, tf.constant(sources), bos_id=BOS, eos_id=EOS,
                                 max_extra=max_extra),
                   beam_search(model, tf.constant(sources), bos_id=BOS, eos_id=EOS,
                               max_extra=max_extra)):
        sequences = result["sequences"].numpy().reshape(len(sources), -1,
                                                        result["sequences"].shape[-1])
        for row, hyps in enumerate(sequences):
            limit = (sources[row] != 0).sum() + max_extra
            for seq in hyps:
                length = int((seq != 0).sum())
                assert 1 <= length <= limit
                assert np.all(seq[:length] != 0) and np.all(seq[length:] == 0)
                assert EOS not in seq[:length - 1]  # EOS ends a hypothesis
                assert seq[length - 1] == EOS or length == limit


def test_decoding_compiles_under_xla(model, rng):
    source = tf.constant(random_ids(rng, 3, 6, 30))
    for search in (greedy_search, beam_search):
        plain = search(model, source, bos_id=BOS, eos_id=EOS, max_extra=4)
        compiled = search(model, source, bos_id=BOS, eos_id=EOS, max_extra=4, jit_compile=True)
        np.testing.assert_array_equal(compiled["sequences"], plain["sequences"])
        np.testing.assert_allclose(compiled["scores"], plain["scores"], rtol=1e-4, atol=1e-4)


def test_cross_attention_of_the_chosen_hypothesis(model, rng):
    source = tf.constant(random_ids(rng, 2, 6, 30, min_length=3))
    result = beam_search(model, source, bos_id=BOS, eos_id=EOS, max_extra=4,
                         return_attention=True)
    attention = result["attention"].numpy()
    assert attention.shape == (2, 4, 10, 6)
    sequences = result["sequences"].numpy()
    real = sequences != 0
    np.testing.assert_allclose(attention[real].sum(-1), 1.0, atol=1e-5)
    padding = (source.numpy() == 0)[:, None, None, :]
    assert np.all(np.where(np.broadcast_to(padding, attention.shape), attention, 0) < 1e-6)
    # The best hypothesis's weights equal a teacher-forced pass over it (a second code path).
    best = sequences[:, 0]
    inputs = np.concatenate([np.full((2, 1), BOS), best[:, :-1]], 1)
    memory = model.encode(source)
    _, weights = model.decode(tf.constant(inputs), memory, source, return_attention_scores=True)
    forced = tf.reduce_mean(weights[-1]["cross"], axis=1).numpy()
    np.testing.assert_allclose(attention[:, 0][real[:, 0]], forced[real[:, 0]], atol=1e-4)


def test_translators_of_one_model_share_its_traced_searches(sample_tokenizer, monkeypatch):
    """The trainer's validation (greedy), its final evaluation (beam) and the export each make
    a Translator of the same model: each search is traced once for the model (counted by
    wrapping it), a second model's Translator traces its own and translates with its own
    weights, and the traces do not keep a model alive."""
    import gc
    import weakref

    import keras_transformer.translator as translator_module

    traces = []
    for name in ("greedy_search", "beam_search"):
        search = getattr(translator_module, name)
        monkeypatch.setattr(translator_module, name, lambda *args, _name=name, _search=search,
                            **kwargs: traces.append(_name) or _search(*args, **kwargs))
    texts = ["Der Hund schläft.", "Ich lache."]
    models = []
    for seed in (5, 6):
        tf.keras.utils.set_random_seed(seed)
        models.append(kt.Transformer(small_config(vocab_size=sample_tokenizer.vocab_size)))
        models[-1].build()
    greedy = translator_module.Translator(models[0], sample_tokenizer, beam_size=1, max_extra=6)
    first = greedy.translate(texts)
    beam = translator_module.Translator(models[0], sample_tokenizer, max_extra=6)
    beam.translate(texts)
    assert translator_module.Translator(models[0], sample_tokenizer, beam_size=1,
                                        max_extra=6).translate(texts) == first
    assert sorted(traces) == ["beam_search", "greedy_search"]
    other = translator_module.Translator(models[1], sample_tokenizer, beam_size=1, max_extra=6)
    translations = other.translate(texts)
    assert translations != first  # else a shared trace could pass unseen
    for text, translation in zip(texts, translations):
        expected = greedy_search(models[1], tf.constant(other.encode([text])), bos_id=BOS,
                                 eos_id=EOS, max_extra=6)["sequences"]
        assert translation == sample_tokenizer.detokenize(expected).numpy()[0].decode()
    assert traces.count("greedy_search") == 2  # and the second model's own trace
    first_model = weakref.ref(models[0])
    del models[0], greedy, beam
    gc.collect()
    assert first_model() is None


def test_translator_matches_beam_search_and_keeps_order(sample_tokenizer, rng):
    from keras_transformer.translator import Translator

    tf.keras.utils.set_random_seed(5)
    model = kt.Transformer(small_config(vocab_size=sample_tokenizer.vocab_size))
    model.build()
    texts = ["Der Hund schläft.", "", "Die alten Männer sehen keine roten Autos.", "Ich lache.",
             "Er weiß, dass das Kind singt.", "Äpfel?", "Wir warten."]
    # Batches of 2: the first decoded alone, the other two at once (concurrent_batches=2).
    translator = Translator(model, sample_tokenizer, max_extra=6, batch_size=2)
    translations = translator.translate(texts)
    assert translator.translate([]) == []
    one_at_a_time = Translator(model, sample_tokenizer, max_extra=6, batch_size=2,
                               concurrent_batches=1)
    assert one_at_a_time.translate(texts) == translations
    with pytest.raises(ValueError, match="concurrent_batches=0"):
        Translator(model, sample_tokenizer, concurrent_batches=0)
    for text, translation in zip(texts, translations):
        source = translator.encode([text])
        best = beam_search(model, tf.constant(source), bos_id=BOS, eos_id=EOS, max_extra=6)
        expected = sample_tokenizer.detokenize(best["sequences"][:, 0]).numpy()[0].decode()
        # Issue 23, item 10: a blank text gives "", as the SavedModel answers it; decoding
        # EOS alone would invent a sentence.
        assert translation == (expected if text.strip() else "")
    assert translations[1] == "" and translator.translate(["  ", "\t"]) == ["", ""]
    assert translator.translate([texts[0].encode("utf-8")]) == translations[:1]
    # Item 17: bytes that are not UTF-8 are refused, naming the row.
    with pytest.raises(ValueError, match="input row 1 is not valid UTF-8"):
        translator.translate(["Ich lache.", b"\xff\xfe\xfa abc"])
    # Items 12 and 18: ids outside the vocabulary are refused, naming the row.
    with pytest.raises(ValueError, match="source row 1: id -1 is outside the vocabulary"):
        translator.translate_ids([[5, 2], [5, -1, 2]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        translator.translate_ids([[sample_tokenizer.vocab_size, 2]])
    shuffled = rng.permutation(len(texts))
    again = translator.translate([texts[i] for i in shuffled])
    assert again == [translations[i] for i in shuffled]


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_cache_gives_the_same_result_as_recomputing_the_prefix(model, rng, search):
    source = tf.constant(random_ids(rng, 3, 6, 30))
    cached = search(model, source, bos_id=BOS, eos_id=EOS, max_extra=5, return_attention=True)
    plain = search(model, source, bos_id=BOS, eos_id=EOS, max_extra=5, return_attention=True,
                   use_cache=False)
    np.testing.assert_array_equal(cached["sequences"], plain["sequences"])
    np.testing.assert_allclose(cached["scores"], plain["scores"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cached["attention"], plain["attention"], atol=1e-5)


def test_a_growing_cache_decodes_as_the_whole_one(model, rng, monkeypatch):
    """Where the length is not static (the translators' and the SavedModel's traces) the
    searches start the self-attention cache at 16 positions and double it (keras_transformer/
    cache.py): with EOS never produced, 45 steps take it through 16, 32 and 45 positions, and
    the hypotheses and scores are those of the same search with static shapes, which
    allocates the whole cache at once."""
    from keras_transformer import cache
    from keras_transformer.translator import traced_searches

    traced_with_room = []
    with_room = cache.with_room
    monkeypatch.setattr(cache, "with_room",
                        lambda *args: traced_with_room.append(1) or with_room(*args))
    source = random_ids(rng, 3, 5, 30, min_length=5)
    never = 30  # outside the vocabulary: no hypothesis ends before the limit
    greedy, beam = traced_searches(model, BOS, never, "gnmt")  # traced at their first call
    extra = tf.constant(40)
    grown = {"greedy": greedy(tf.constant(source), extra),
             "beam": beam(tf.constant(source), tf.constant(3), tf.constant(0.6), extra,
                          tf.constant(2))}
    assert len(traced_with_room) == 2  # each search's trace grows its cache
    whole = {"greedy": greedy_search(model, source, bos_id=BOS, eos_id=never, max_extra=40),
             "beam": beam_search(model, source, bos_id=BOS, eos_id=never, beam_size=3,
                                 max_extra=40, num_return=2)}
    for name in grown:
        sequences, scores = grown[name]
        expected = whole[name]
        expected_sequences = np.reshape(expected["sequences"], sequences.shape)
        assert sequences.shape[-1] == 45 and np.all(expected_sequences != 0)
        np.testing.assert_array_equal(sequences, expected_sequences)
        np.testing.assert_allclose(scores, np.reshape(expected["scores"], scores.shape),
                                   rtol=1e-5)
    # The buffers' growth itself: doubled when the position reaches their end, capped.
    buffers = [{"key": tf.ones((2, 1, 16, 3)), "value": tf.ones((2, 1, 16, 3))}]
    for index, length in ((15, 16), (16, 32), (32, 45)):
        buffers = cache.with_room(buffers, tf.constant(index), tf.constant(45))
        assert buffers[0]["key"].shape[2] == length
    np.testing.assert_array_equal(buffers[0]["value"][:, :, 16:], 0)


def test_a_pad_id_other_than_zero_is_honoured(rng, sample_tokenizer):
    """Issue 14, item 5: with config.pad_id = 7 a batch padded with 7 decodes each row as that
    row alone, unpadded (the masks read pad_id), and outputs are padded with 7, never 0; the
    loss skips 7s (NumPy re-computation); a tokenizer whose pad id differs is refused."""
    from test_losses import numpy_label_smoothing

    from keras_transformer.config import ConfigError

    tf.keras.utils.set_random_seed(5)
    model = kt.Transformer(small_config(vocab_size=30, pad_id=7))
    model.build()
    source = random_ids(rng, 3, 6, 30, min_length=2)
    source[source == 7] = 8
    lengths = (source != 0).sum(1)
    source[source == 0] = 7
    for search in (lambda ids: greedy_search(model, ids, bos_id=BOS, eos_id=EOS, max_extra=3),
                   lambda ids: {k: v[:, 0] for k, v in beam_search(
                       model, ids, bos_id=BOS, eos_id=EOS, beam_size=3, max_extra=3).items()}):
        batch = search(tf.constant(source))
        assert not np.any(batch["sequences"].numpy() == 0)
        for row, length in enumerate(lengths):
            alone = search(tf.constant(source[row:row + 1, :length]))
            sequence = batch["sequences"][row].numpy()
            np.testing.assert_array_equal(sequence[:length + 3], alone["sequences"][0])
            assert np.all(sequence[length + 3:] == 7)
            np.testing.assert_allclose(batch["scores"][row], alone["scores"][0], rtol=1e-4)

    labels = random_ids(rng, 4, 6, 11)
    labels[labels == 0] = 7
    logits = rng.normal(size=(4, 6, 11)) * 3
    _, expected = numpy_label_smoothing(labels, logits, 0.1, pad_id=7)
    loss = kt.LabelSmoothedCrossEntropy(0.1, pad_id=7)
    np.testing.assert_allclose(loss(tf.constant(labels), tf.constant(logits, tf.float32)),
                               expected, rtol=1e-5)
    with pytest.raises(ConfigError, match="pad_id=7 differs from the vocabulary's pad id 0"):
        kt.Translator(model, sample_tokenizer)


def test_eager_search_takes_tensor_settings(model, rng):
    """Issue 23, item 14: the docstring allows tensors for beam_size, alpha and max_extra;
    called eagerly with them, the search runs (a tensor cannot key the traced-function
    cache) and gives the same result as with Python numbers."""
    source = tf.constant(random_ids(rng, 2, 5, 30))
    as_numbers = beam_search(model, source, bos_id=BOS, eos_id=EOS, beam_size=2, alpha=0.6,
                             max_extra=4)
    for _ in range(2):  # the second call reuses the traced function
        as_tensors = beam_search(model, source, bos_id=BOS, eos_id=EOS,
                                 beam_size=tf.constant(2), alpha=tf.constant(0.6),
                                 max_extra=tf.constant(4))
        np.testing.assert_array_equal(as_tensors["sequences"], as_numbers["sequences"])
        np.testing.assert_allclose(as_tensors["scores"], as_numbers["scores"], rtol=1e-5)
    wider = beam_search(model, source, bos_id=BOS, eos_id=EOS, beam_size=tf.constant(3),
                        alpha=tf.constant(0.6), max_extra=tf.constant(4))
    assert wider["sequences"].shape[1] == 3
