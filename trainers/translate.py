"""Translate with a trained model: sentences from the arguments, a file, or standard input.

    python -m trainers.translate --model_dir runs/sample-tiny "The dog sleeps."
    python -m trainers.translate --model_dir runs/wmt14-base --input news.en --output news.de
    cat news.en | python -m trainers.translate --model_dir runs/wmt14-base
    python -m trainers.translate --engine ctranslate2 --model_dir models/ct2 "The dog sleeps."

--engine ctranslate2 reads a model converted by `python -m export.ctranslate2` (its beam
search divides scores by |Y| ** alpha, not by the paper's GNMT penalty).
"""

import argparse
import logging
import sys

from trainers import command_line


def make_translator(args):
    """The engine's translator (both have `translate(texts)`)."""
    settings = dict(beam_size=args.beam_size, alpha=args.alpha, max_extra=args.max_extra,
                    batch_size=args.batch_size)
    if args.engine == "ctranslate2":
        from export.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator(args.model_dir, compute_type=args.compute_type, **settings)
    from keras_transformer.translator import Translator
    from keras_transformer import run_dir

    model, tokenizer, _ = run_dir.load_trained(args.model_dir, args.weights)
    return Translator(model, tokenizer, **settings)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m trainers.translate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True,
                        help="a trained run (--engine tensorflow) or a CTranslate2 export")
    parser.add_argument("--engine", choices=("tensorflow", "ctranslate2"), default="tensorflow")
    parser.add_argument("--compute_type", default="default",
                        help="--engine ctranslate2: e.g. int8, float32 (default: as converted)")
    parser.add_argument("--weights", default=None,
                        help="default: averaged.weights.h5, else the newest checkpoint")
    parser.add_argument("--input", default=None, help="one sentence per line (default: stdin)")
    parser.add_argument("--output", default=None, help="default: stdout")
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max_extra", type=int, default=50)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("sentences", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    try:
        translator = make_translator(args)
    except ImportError as error:
        if args.engine != "ctranslate2":
            raise
        print(f'error: {error}: pip install -e ".[ctranslate2]"', file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.sentences:
        lines = args.sentences
    else:  # bytes: a line that is not UTF-8 is refused by the translator, naming it
        source = open(args.input, "rb") if args.input else sys.stdin.buffer
        with source:
            lines = [line.rstrip(b"\r\n") for line in source]
    try:
        translations = translator.translate(lines)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    output = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with output if args.output else open(1, "w", closefd=False, encoding="utf-8") as out:
        for translation in translations:
            out.write(translation + "\n")
    return 0


if __name__ == "__main__":
    command_line.exit_skipping_teardown(main())
