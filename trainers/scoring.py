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
    "tokenized_bleu": `tokenized_bleu_score`, the paper's way (usually 0.6-1.5 above
    sacreBLEU).
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
        result["tokenized_bleu"] = tokenized_bleu_score(hypotheses, references)
    return result


def tokenized_bleu_score(hypotheses, references):
    """BLEU as tensor2tensor's get_ende_bleu.sh computes the paper's figures: tokenize
    (sacreBLEU's 13a tokenizer standing in for Moses' tokenizer.perl), split compounds, then
    BLEU on whitespace tokens (multi-bleu.perl). Tokenizing after the split would cut every
    ##AT##-##AT## into a run of easy matches."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()
    prepared = [[split_compounds(tokenize(text)) for text in texts]
                for texts in (hypotheses, references)]
    return sacrebleu.metrics.BLEU(tokenize="none").corpus_score(prepared[0], [prepared[1]]).score
