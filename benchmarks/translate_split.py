"""A trained run's evaluation split translated as the trainer's final evaluation translates it
(`Translator`, beam search at the run's options, its decoding batch size), several rounds in one
process (the first includes tracing the search), once per source tree, the trees one after the
other, with the CPU model and flags, sentences/s, BLEU and a digest of the translations (equal
digests: the same translations).

    python -m benchmarks.translate_split --model_dir runs/sample-tiny [--split test]
        [--rounds 3] [--beam_size N] [--trees /tmp/old,.] [--repeats 1] [--out FILE.json]

Unlike `benchmarks.decoding`, which makes every hypothesis run to a fixed length, the sentences
here end where the model ends them, so the limit of source length + max_extra positions that
decoding allows but rarely uses counts as it does in use.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import types


def translate_rounds(model_dir, split, rounds, beam_size=None):
    """(Runs in the tree's process.) Seconds of each round, sentences, BLEU, digest; at the
    run's beam size unless `beam_size` is given."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_transformer import run_dir
    from keras_transformer.translator import Translator
    from trainers import run_data
    from trainers.scoring import score

    model, tokenizer, settings = run_dir.load_trained(model_dir)
    settings = types.SimpleNamespace(**settings)
    pairs = list(run_data.split_pairs(settings, split).as_numpy_iterator())
    sources = [s.decode("utf-8") for s, _ in pairs]
    references = [t.decode("utf-8") for _, t in pairs]
    beam_size = beam_size or settings.beam_size
    translator = Translator(model, tokenizer, beam_size=beam_size, alpha=settings.alpha,
                            max_extra=settings.max_extra, batch_size=settings.eval_batch_size)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        hypotheses = translator.translate(sources)
        seconds.append(time.perf_counter() - start)
    return {"round_seconds": seconds, "sentences": len(sources), "beam_size": beam_size,
            "bleu": score(hypotheses, references, False)["bleu"],
            "digest": hashlib.sha256("\n".join(hypotheses).encode()).hexdigest()[:12]}


def run_tree(tree, model_dir, split, rounds, beam_size=None):
    """`translate_rounds` in a fresh process that imports the library from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(tree).resolve())}
    # Run as a file, so that the tree's own `benchmarks` (which may lack this one) is not used.
    result = subprocess.run(
        [sys.executable, __file__, "--child", "--model_dir", str(model_dir), "--split", split,
         "--rounds", str(rounds), *([] if beam_size is None else ["--beam_size", str(beam_size)])],
        env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{tree}: translating failed:\n{result.stderr[-3000:]}")
    from benchmarks.quick_start import commit

    return {"tree": tree, "commit": commit(tree), **json.loads(result.stdout.splitlines()[-1])}


def table(runs, machine, model_dir, split):
    from benchmarks.end_to_end import describe_hardware

    lines = [f"{describe_hardware(machine)}; the {split} split of {model_dir} translated by "
             "`Translator` at the run's beam options, one process per run, the trees one after "
             "the other", "",
             "| tree | beam | first round (with tracing) | later rounds | sentences/s (best later "
             "round) | BLEU | digest |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        first, *later = r["round_seconds"]
        best = min(later or [first])
        lines.append(f"| {r['tree']} ({r['commit']}) | {r['beam_size']} | {first:.2f} s | "
                     f"{', '.join(f'{s:.2f}' for s in later) or '-'} s | "
                     f"{r['sentences'] / best:.1f} | {r['bleu']:.2f} | {r['digest']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam_size", type=int, default=None, help="default: the run's")
    parser.add_argument("--trees", default=".",
                        help="comma-separated source trees, run one after the other")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of trees, alternating")
    parser.add_argument("--out", default="benchmarks/results/translate_split.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(translate_rounds(args.model_dir, args.split, args.rounds,
                                          args.beam_size)))
        return
    from benchmarks import save
    from benchmarks.end_to_end import hardware

    machine = hardware()
    trees = args.trees.split(",")
    runs = []
    for repeat in range(args.repeats):
        for tree in trees if repeat % 2 == 0 else trees[::-1]:
            runs.append(run_tree(tree, args.model_dir, args.split, args.rounds,
                                 args.beam_size))
            print(runs[-1], flush=True)
    save(args.out, {"machine": machine, "model_dir": str(args.model_dir), "split": args.split,
                    "runs": runs}, table(runs, machine, args.model_dir, args.split))


if __name__ == "__main__":
    main()
