"""BLEU as the paper reports it, against a computation by hand."""

import collections
import math

import pytest

from trainers.scoring import score, split_compounds, tokenized_bleu_score


def multi_bleu(hypotheses, references):
    """multi-bleu.perl's corpus BLEU on whitespace tokens, one reference: the geometric mean
    of the clipped 1- to 4-gram precisions times exp(1 - r/c) when c < r."""
    matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
    for hypothesis, reference in zip(hypotheses, references):
        h, ref = hypothesis.split(), reference.split()
        c, r = c + len(h), r + len(ref)
        for n in range(1, 5):
            grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            wanted = collections.Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(k, wanted[g]) for g, k in grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    return 100 * math.exp(precision + min(0.0, 1 - r / c))


def test_tokenized_bleu_is_get_ende_bleu():
    """Issue 23, item 9: tokenize, split compounds, BLEU on whitespace tokens (the paper's
    script). 13a after the split cut each ##AT##-##AT## into about eleven tokens, all easy
    matches, and inflated the score."""
    hypotheses = ["Das Hotel-Zimmer ist sehr groß, sagte er.",
                  "Die Welt-Meisterschaft beginnt heute in der Stadt."]
    references = ["Das Hotel-Zimmer war groß, sagte sie.",
                  "Die Fußball-Weltmeisterschaft beginnt morgen in der Stadt."]
    tokenized = ["Das Hotel ##AT##-##AT## Zimmer ist sehr groß , sagte er .",
                 "Die Welt ##AT##-##AT## Meisterschaft beginnt heute in der Stadt ."]
    tokenized_refs = ["Das Hotel ##AT##-##AT## Zimmer war groß , sagte sie .",
                      "Die Fußball ##AT##-##AT## Weltmeisterschaft beginnt morgen in der Stadt ."]
    assert [split_compounds(h.replace(",", " ,").replace(".", " .")) for h in hypotheses] == \
        tokenized
    expected = multi_bleu(tokenized, tokenized_refs)
    assert tokenized_bleu_score(hypotheses, references) == pytest.approx(expected, abs=1e-6)
    assert score(hypotheses, references, tokenized_bleu=True)["tokenized_bleu"] == \
        pytest.approx(expected, abs=1e-6)
