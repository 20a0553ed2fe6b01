"""The end of a run: the last checkpoints averaged (§6.1), the evaluation splits translated
with beam search and scored, and the averaged model exported for TF Serving."""

import json
import time

from keras_transformer import run_dir
from keras_transformer.translator import Translator
from trainers import checkpoints, run_data
from trainers.scoring import score


def average_last(settings, model, model_dir):
    """Sets `model`'s weights to the mean of the last --average_last checkpoints and saves
    them as averaged.weights.h5."""
    found = run_dir.list_checkpoints(model_dir / "checkpoints")
    if not found:
        raise FileNotFoundError(f"No checkpoints in {model_dir / 'checkpoints'} to evaluate.")
    chosen = found[-settings.average_last:]
    checkpoints.average_checkpoints(model, chosen)
    run_dir.save_model_weights(model, model_dir / "averaged.weights.h5")
    print(f"Averaged {len(chosen)} checkpoint(s): {', '.join(p.name for p in chosen)}")
    best = model_dir / "best" / "best.json"
    if best.exists():
        record = json.loads(best.read_text())
        print(f"Best during training: step {record['step']}, validation {record['metric']} "
              f"{record['value']:.4g} (in {best.parent})")


def translate_split(settings, translator, split, out_dir):
    """Translates and scores one split; writes <split>.txt; returns its scores."""
    pairs = list(run_data.split_pairs(settings, split).as_numpy_iterator())
    if settings.eval_max_sentences:
        pairs = pairs[:settings.eval_max_sentences]
    sources = [s.decode("utf-8") for s, _ in pairs]
    references = [t.decode("utf-8") for _, t in pairs]
    start = time.perf_counter()
    hypotheses = translator.translate(sources)
    seconds = time.perf_counter() - start
    run_dir.write_text_atomically(out_dir / f"{split}.txt",
                                  "".join(h + "\n" for h in hypotheses))
    scores = score(hypotheses, references, settings.tokenized_bleu)
    scores.update(sentences=len(sources), seconds=seconds)
    print(f"{split}: BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']}), "
          f"chrF = {scores['chrf']:.2f}"
          + (f", tokenized BLEU = {scores['tokenized_bleu']:.2f}"
             if "tokenized_bleu" in scores else "")
          + f"  [{len(sources)} sentences in {seconds:.0f} s]")
    for source, hypothesis, reference in list(zip(sources, hypotheses, references))[:3]:
        print(f"  {source}\n  -> {hypothesis}\n  (reference: {reference})")
    return scores


def evaluate(settings, config, tokenizer, model_dir, model=None):
    """Averages the last checkpoints into `model` (default a fresh one), translates the
    evaluation splits with beam search, scores them and exports the averaged model (unless
    --no_export). Returns {split: scores}."""
    # A model built outside any strategy's scope and without the training state translates
    # and exports (the trained one failed to retrace beam search in its process): the one
    # that translated during training, whose searches are traced, or a fresh one.
    model = run_dir.build_model(config) if model is None else model
    average_last(settings, model, model_dir)
    translator = Translator(model, tokenizer, beam_size=settings.beam_size,
                            alpha=settings.alpha, max_extra=settings.max_extra,
                            batch_size=settings.eval_batch_size)
    out_dir = model_dir / "translations"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {split: translate_split(settings, translator, split, out_dir)
               for split in settings.eval_split_names()}
    run_dir.write_text_atomically(out_dir / "results.json", json.dumps(results, indent=2))
    if not settings.no_export:
        from export.saved_model import export

        target = export(model, model_dir / "vocab.model", model_dir / "export",
                        beam_size=settings.beam_size, alpha=settings.alpha,
                        max_extra=settings.max_extra, translator=translator)
        print(f"Exported the averaged model for TF Serving: {target}")
    return results
