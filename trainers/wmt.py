"""Train the Transformer on WMT 2014 English-German (or the embedded sample corpus, or your
own files) under any tf.distribute strategy, then average checkpoints and report BLEU.

examples:
  python -m trainers.wmt --strategy mirrored --dataset sample     # minutes, on a CPU
  python -m trainers.wmt --strategy mirrored --preset base         # the paper's base model
  python -m trainers.wmt --config run.yaml --train_steps 2000      # a file, one flag changed
  python -m trainers.wmt --config runs/x/config.json --model_dir runs/y   # repeat a run
  python -m trainers.wmt --model_dir runs/x --eval_only            # re-evaluate a run

A killed run started again with the same command resumes where it was: the weights, the
optimizer and the input pipeline's position are backed up every --backup_every_steps.
Validation loss and perplexity come every --validate_every_steps steps, BLEU and chrF on the
first --eval_sentences validation sentences every --eval_every_steps; best/ keeps the best step.
"""

import dataclasses
import logging
import pathlib
import sys

from trainers import command_line
from trainers.settings import DATASET_DEFAULTS, RENAMED, RUN_ONLY, resolve_settings


def build_parser():
    """The command line (trainers/command_line.py), with this module's examples."""
    return command_line.build_parser(__doc__)


def parse_arguments(argv=None):
    """(args, given): the parsed flags, a --config file's under the command line's, and the
    names of the flags either set (trainers/command_line.py)."""
    return command_line.parse_arguments(argv, __doc__)


def run(argv=None):
    """The job that `argv` (the command line's words) describes. Returns {split: scores}
    from the final evaluation, or None."""
    return run_parsed(*parse_arguments(argv))


def fill_from_run(args, given):
    """--eval_only: every flag not `given` takes the value the run in --model_dir used."""
    from keras_transformer import run_dir

    preset = args.preset or DATASET_DEFAULTS[args.dataset]["preset"]
    model_dir = pathlib.Path(args.model_dir or f"runs/{args.dataset}-{preset}")
    saved_config, saved = run_dir.read_run_config(model_dir)
    for key, value in {**saved, **saved_config.to_dict()}.items():
        key = RENAMED.get(key, key)
        if key not in given and key not in RUN_ONLY and hasattr(args, key):
            setattr(args, key, value)
    args.model_dir = str(model_dir)


def start_tensorflow(settings):
    """Seeds, determinism, the strategy, the steps per call and the precision policy; returns
    the strategy."""
    import keras
    import tensorflow as tf

    from trainers.precision import choose_precision
    from trainers.settings import choose_execution
    from trainers.strategy import resolve_strategy, split_cpu

    if settings.logical_cpus:
        split_cpu(settings.logical_cpus)
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = resolve_strategy(settings.strategy, settings.tpu)
    choose_execution(settings, strategy.num_replicas_in_sync)
    chosen, why = choose_precision(settings.precision, strategy)
    settings.precision_chosen, settings.precision_reason = chosen, why
    keras.mixed_precision.set_global_policy(chosen)
    print(f"precision {chosen} ({why})", flush=True)
    return strategy


def run_parsed(args, given=()):
    """`run` for parsed flags; `given` names the flags set by the command line or --config
    (with --eval_only the run's own settings fill in the others)."""
    if args.eval_only:
        fill_from_run(args, given)
    config, settings = resolve_settings(args)
    strategy = start_tensorflow(settings)
    from keras_transformer import run_dir
    from trainers.run_data import get_tokenizer
    from trainers.final_evaluation import evaluate
    from trainers.strategy import is_chief
    from trainers.training import train
    from trainers.validation import WeightsCopy

    model_dir = pathlib.Path(settings.model_dir)
    if settings.eval_only:
        config, _ = run_dir.read_run_config(model_dir)
        return evaluate(settings, config, run_dir.load_tokenizer(model_dir), model_dir)
    tokenizer = get_tokenizer(settings, config, model_dir)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    run_dir.check_same_shape(model_dir, config)
    if is_chief(strategy):
        tokenizer.save(model_dir / "vocab.model")
        run_dir.write_run_config(model_dir, config, settings.to_dict())
    print(f"{settings.preset} model: {config.num_layers}+{config.num_layers} layers, "
          f"d_model {config.d_model}, vocab {config.vocab_size}; strategy {settings.strategy} "
          f"({strategy.num_replicas_in_sync} replica(s), {settings.steps_per_execution_chosen} "
          f"step(s) a call); {config.train_steps} steps of "
          f"{settings.batch_tokens} tokens; model_dir {model_dir}", flush=True)
    # One model outside the strategy translates: during training, then for the final
    # evaluation and the export, which reuse its traced searches.
    decoding = WeightsCopy(config)
    train(settings, config, strategy, tokenizer, model_dir, decoding)
    if settings.no_eval or not is_chief(strategy):
        return None
    return evaluate(settings, config, tokenizer, model_dir, decoding.model)


def main(argv=None):
    args, given = parse_arguments(argv)  # --help ends here, before TensorFlow is imported
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "tensorflow"):  # SavedModel tracing chatter
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from keras_transformer.config import ConfigError
    from keras_transformer.data.corpora import DataError
    from trainers.strategy import StrategyError

    try:
        run_parsed(args, given)
    except (ConfigError, DataError, StrategyError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    command_line.exit_skipping_teardown(main())
