"""Translation quality: sacreBLEU (with its signature) and chrF on detokenized output, and the
paper's tokenized BLEU with compound splitting, for comparison with Table 2."""

import re

import sacrebleu

_COMPOUND = re.compile(r"(?<=\S)-(?=\S)")


def split_compounds(text):
    """The paper's compound splitting (tensor2tensor's get_ende_bleu.sh): "a-b" -> "a ##AT##-##AT## b"."""
    return _COMPOUND.sub(" ##AT##-##AT## ", text)


def score(hypotheses, references, tokenized_bleu=False):
    """Corpus scores of `hypotheses` against one reference each.

    Returns {"bleu", "bleu_signature", "chrf", "chrf_signature"} and, with `tokenized_bleu`,
    "tokenized_bleu": BLEU on 13a-tokenized text after compound splitting, the closest
    sacreBLEU gets to the paper's multi-bleu numbers (usually 0.6-1.5 above sacreBLEU).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    result = {
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "chrf_signature": str(chrf.get_signature()),
    }
    if tokenized_bleu:
        split = sacrebleu.metrics.BLEU(tokenize="13a")
        result["tokenized_bleu"] = split.corpus_score(
            [split_compounds(h) for h in hypotheses],
            [[split_compounds(r) for r in references]]).score
    return result
