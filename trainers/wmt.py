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
Validation loss and perplexity come every --steps_per_epoch steps, BLEU and chrF on the first
--eval_sentences validation sentences every --eval_every_steps; best/ keeps the best step.
"""

import argparse
import dataclasses
import importlib.util
import json
import logging
import pathlib
import sys
import time

DATASET_DEFAULTS = {
    # Sized so that the main job runs in a few minutes on two CPU cores.
    # Its sentence templates are nearly fixed by their length: batches of one length learn
    # slowly there, so each row holds several pairs of mixed lengths (batching "concat", see
    # keras_transformer/data/pipeline.py).
    "sample": dict(preset="tiny", vocab_size=2000, batch_tokens=2048, max_train_length=64,
                   batching="concat",
                   train_steps=170, warmup_steps=130, lr_scale=0.5, steps_per_epoch=85,
                   backup_every_steps=85, checkpoint_every_steps=34, average_last=2,
                   eval_splits="test", eval_every_steps=85, eval_sentences=100),
    # §5: 25,000 source and 25,000 target tokens per batch, sequences up to 256 pieces.
    "wmt14": dict(preset="base", vocab_size=37000, batch_tokens=25000, max_train_length=256,
                  batching="packed",
                  steps_per_epoch=1000, backup_every_steps=250, checkpoint_every_steps=None,
                  average_last=None, eval_splits="validation,test", eval_every_steps=5000,
                  eval_sentences=500),
}
DATASET_DEFAULTS["files"] = dict(DATASET_DEFAULTS["wmt14"])
SKIP_COUNTS = {}  # --dataset files: lines skipped per split, counted as the data is read
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")
PER_DATASET = "default per --dataset: "


def _bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _per_dataset(key):
    """`--help` text for a default that depends on --dataset."""
    values = {name: defaults.get(key) for name, defaults in DATASET_DEFAULTS.items()}
    return PER_DATASET + ", ".join(f"{name} {value}" for name, value in values.items())


def _light_config():
    """keras_transformer/config.py, loaded alone: the package's __init__ imports TensorFlow
    (it registers the layers with Keras), and `--help` should answer at once."""
    package = importlib.util.find_spec("keras_transformer").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("_keras_transformer_config",
                                                  pathlib.Path(package) / "config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' layout and shows each flag's default after its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser():
    config = _light_config()
    parser = argparse.ArgumentParser(prog="python -m trainers.wmt", description=__doc__,
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a .yaml or .json file of flag values (keys as the flags, without "
                             "--), e.g. a run's own config.json; flags given here override it")
    run = parser.add_argument_group("distribution and precision")
    run.add_argument("--strategy", choices=STRATEGIES, default="default",
                     help="tf.distribute strategy: mirrored uses every local GPU (or "
                          "--logical_cpus), multi_worker reads TF_CONFIG")
    run.add_argument("--tpu", default=None, help="TPU name or grpc:// address ('local' on a TPU VM)")
    run.add_argument("--logical_cpus", type=int, default=None,
                     help="split the CPU into N devices (mirrored replicas without GPUs)")
    run.add_argument("--precision", choices=PRECISIONS, default="auto",
                     help="auto: mixed_bfloat16 on TPUs, GPUs and CPUs with native bfloat16 "
                          "(AMX, AVX512-BF16), float32 elsewhere")
    run.add_argument("--steps_per_execution", type=int, default=1,
                     help="train steps per call into the graph (TPU or one device; not "
                          "MirroredStrategy on CPUs)")
    run.add_argument("--jit_compile", action="store_true", help="compile the train step with XLA")
    run.add_argument("--static_batches", action="store_true",
                     help="bucketed static shapes (implied by --strategy tpu)")
    run.add_argument("--batching", choices=("packed", "mixed", "concat"), default=None,
                     help="packed: batches of one target length filling the budget; "
                          "mixed: batches of mixed lengths; concat: several pairs per row of "
                          "--max_train_length tokens, kept apart by masks; "
                          + _per_dataset("batching"))
    run.add_argument("--deterministic", action="store_true",
                     help="enable op determinism (a resumed run then ends with the same "
                          "weights as an uninterrupted one)")
    run.add_argument("--seed", type=int, default=0, help="seeds weights, dropout and shuffling")

    model = parser.add_argument_group("model (Table 3): a preset plus overrides")
    model.add_argument("--preset", choices=sorted(config.PRESETS), default=None,
                       help="model size; " + _per_dataset("preset"))
    for field in dataclasses.fields(config.TransformerConfig):
        kind = {bool: _bool, int: int, float: float, str: str}.get(field.type, int)  # int | None
        choices = ("sinusoidal", "learned") if field.name == "position" else None
        # A bare boolean flag (`--norm_first`) means true; `--norm_first false` also works.
        bare = dict(nargs="?", const=True) if kind is _bool else {}
        by_preset = ", ".join(f"{name} {values.get(field.name, field.default)}"
                              for name, values in config.PRESETS.items())
        dataset_default = {name: d[field.name] for name, d in DATASET_DEFAULTS.items()
                           if field.name in d}
        note = f"default: the preset's ({by_preset})"
        if dataset_default:
            note += "; " + ", ".join(f"--dataset {n} {v}" for n, v in dataset_default.items())
        model.add_argument(f"--{field.name}", type=kind, default=None, choices=choices,
                           help=f"{config.FIELD_HELP[field.name]}; {note}", **bare)

    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=("wmt14", "sample", "files"), default="wmt14",
                      help="wmt14: TFDS wmt14_translate; sample: the embedded sample corpus; "
                           "files: --train_files etc.")
    data.add_argument("--tfds_name", default="wmt14_translate/de-en", help="TFDS dataset name")
    data.add_argument("--data_dir", default=None, help="TFDS data_dir with a prepared copy")
    data.add_argument("--source_language", default="en", help="language translated from")
    data.add_argument("--target_language", default=None, help="default: the other language")
    for split in ("train", "validation", "test"):
        data.add_argument(f"--{split}_files", nargs="+", default=None, metavar="FILE",
                          help=f"--dataset files: the {split} split, one TSV or two aligned files")
    data.add_argument("--batch_tokens", type=int, default=None,
                      help="source (and target) tokens per global batch, padding included; "
                           + _per_dataset("batch_tokens"))
    data.add_argument("--max_train_length", type=int, default=None,
                      help="longest training source or target kept, in pieces (with BOS/EOS); "
                           + _per_dataset("max_train_length"))
    data.add_argument("--cache_dir", default=str(pathlib.Path.home() / ".cache" / "keras-transformer"),
                      help="where vocabularies are cached")

    train = parser.add_argument_group("training")
    train.add_argument("--model_dir", default=None, help="default: runs/<dataset>-<preset>")
    train.add_argument("--lr_scale", type=float, default=None,
                       help="multiplies the §5.3 learning rate; 1 is the paper; "
                            + _per_dataset("lr_scale"))
    train.add_argument("--grad_accum", type=int, default=1,
                       help="accumulate gradients over N batches (N x batch_tokens per update)")
    train.add_argument("--steps_per_epoch", type=int, default=None,
                       help="steps between validation losses (a multiple of "
                            "--backup_every_steps); " + _per_dataset("steps_per_epoch"))
    train.add_argument("--backup_every_steps", type=int, default=None,
                       help="steps between backups of the training state (weights, optimizer, "
                            "input position) and progress summaries; "
                            + _per_dataset("backup_every_steps"))
    train.add_argument("--checkpoint_every_steps", type=int, default=None,
                       help="steps between the checkpoints that are averaged; "
                            + _per_dataset("checkpoint_every_steps"))
    train.add_argument("--train_minutes", type=float, default=None,
                       help="stop training after M minutes (resumed runs continue the budget), "
                            "then average, evaluate and export as usual")
    train.add_argument("--checkpoint_every_minutes", type=float, default=10.0,
                       help="also checkpoint every M minutes (the paper: 10)")
    train.add_argument("--keep_checkpoints", type=int, default=20,
                       help="checkpoints kept in model_dir/checkpoints")
    train.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None,
                       help="Keras progress: 1 a bar (default on a terminal), 2 a line per "
                            "backup interval (default otherwise)")

    evaluate = parser.add_argument_group("evaluation during training")
    evaluate.add_argument("--no_validation", action="store_true",
                          help="skip the validation loss and perplexity at every "
                               "--steps_per_epoch boundary")
    evaluate.add_argument("--eval_every_steps", type=int, default=None,
                          help="translate the first --eval_sentences validation sentences and "
                               "log BLEU and chrF every N steps (0: never); "
                               + _per_dataset("eval_every_steps"))
    evaluate.add_argument("--eval_sentences", type=int, default=None,
                          help="validation sentences translated at every --eval_every_steps; "
                               + _per_dataset("eval_sentences"))
    evaluate.add_argument("--eval_beam_size", type=int, default=1,
                          help="beam size of those translations (1: greedy)")
    evaluate.add_argument("--best_metric", choices=("bleu", "loss"), default="bleu",
                          help="what model_dir/best/ keeps the best step by (validation BLEU, "
                               "or validation loss; loss when BLEU is not evaluated)")
    evaluate.add_argument("--export_on_best", action="store_true",
                          help="export best/ for TF Serving (best/export/<version>) each time "
                               "it improves")

    final = parser.add_argument_group("final evaluation")
    final.add_argument("--eval_only", action="store_true",
                       help="evaluate --model_dir (with the run's own settings) and stop")
    final.add_argument("--no_eval", action="store_true", help="skip the final evaluation")
    final.add_argument("--no_export", action="store_true",
                       help="skip exporting the averaged model (model_dir/export/<version>)")
    final.add_argument("--average_last", type=int, default=None,
                       help="checkpoints to average (§6.1: 5 for base, 20 for big; 2 for "
                            "--dataset sample)")
    final.add_argument("--eval_splits", default=None,
                       help="comma-separated; " + _per_dataset("eval_splits"))
    final.add_argument("--eval_max_sentences", type=int, default=None,
                       help="translate at most N sentences per split")
    final.add_argument("--beam_size", type=int, default=4, help="§6.1 beam size")
    final.add_argument("--alpha", type=float, default=0.6, help="§6.1 length penalty alpha")
    final.add_argument("--max_extra", type=int, default=50,
                       help="longest output: input length + N (§6.1)")
    final.add_argument("--eval_batch_size", type=int, default=64, help="sentences per batch")
    final.add_argument("--tokenized_bleu", action="store_true",
                       help="also report the paper's tokenized BLEU with compound splitting")
    return parser


def config_file_arguments(path, parser):
    """The flags a --config file sets, as command-line words: a .yaml or .json mapping of flag
    names (without --) to values, or a run's own config.json ({"model": ..., "run": ...}).
    A file that cannot be used ends the program with `parser.error` naming it."""
    path = pathlib.Path(path)
    if not path.exists():
        parser.error(f"--config {path}: no such file.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as error:  # yaml.YAMLError, json.JSONDecodeError
        parser.error(f"--config {path}: not valid {path.suffix[1:] or 'JSON'}: {error}")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values.")
    if set(values) == {"model", "run"}:  # a run's own config.json
        values = {**values["run"], **values["model"]}
        for key in RUN_ONLY:
            values.pop(key, None)
    flags = {action.dest: action for action in parser._actions}
    unknown = sorted(set(values) - set(flags) - {"help"})
    if unknown:
        parser.error(f"--config {path}: unknown keys {unknown}; the keys are the flags' names "
                     "without -- (see --help).")
    words = []
    for key, value in values.items():
        action = flags[key]
        if value is None or key == "config":
            continue
        if action.nargs == 0:  # store_true
            if value:
                words.append(f"--{key}")
            continue
        values_given = value if isinstance(value, list) else [value]
        words += [f"--{key}"] + [str(v).lower() if isinstance(v, bool) else str(v)
                                 for v in values_given]
    return words


# Settings of a run that describe the process rather than the run, left out when a run's
# config.json is read back.
RUN_ONLY = ("eval_only", "model_dir", "verbose", "config")


def parse_arguments(argv=None):
    """(args, given): the parsed flags, with a --config file's values under the command
    line's, and the names of the flags the file or the command line set."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    first = parser.parse_args(argv)
    words = (config_file_arguments(first.config, parser) if first.config else []) + argv
    args = parser.parse_args(words)
    for action in parser._actions:  # which flags were given: parse again without defaults
        action.default = argparse.SUPPRESS
    given = set(vars(parser.parse_args(words)))
    return args, given


def resolve_settings(args):
    """The run's settings: command line over dataset defaults over the preset."""
    from keras_transformer.config import ConfigError, TransformerConfig

    defaults = DATASET_DEFAULTS[args.dataset]
    preset = args.preset or defaults["preset"]
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    overrides = {k: v for k, v in defaults.items() if k in fields}
    overrides.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    config = TransformerConfig.preset(preset, **overrides)
    settings = {k: v for k, v in vars(args).items() if k not in fields}
    for key in ("batch_tokens", "max_train_length", "lr_scale", "steps_per_epoch",
                "backup_every_steps", "checkpoint_every_steps", "average_last", "eval_splits",
                "batching", "eval_every_steps", "eval_sentences"):
        if settings.get(key) is None:
            settings[key] = defaults.get(key)
    settings["lr_scale"] = settings["lr_scale"] or 1.0
    settings["steps_per_epoch"] = min(settings["steps_per_epoch"], config.train_steps)
    if args.backup_every_steps is None:  # the largest divisor of an epoch up to the default
        settings["backup_every_steps"] = max(
            n for n in range(1, min(settings["backup_every_steps"], settings["steps_per_epoch"]) + 1)
            if settings["steps_per_epoch"] % n == 0)
    settings["average_last"] = settings["average_last"] or (20 if preset == "big" else 5)
    settings["preset"] = preset
    if settings["verbose"] is None:
        settings["verbose"] = 1 if sys.stdout.isatty() else 2
    settings["model_dir"] = settings["model_dir"] or f"runs/{args.dataset}-{preset}"
    if args.dataset == "files" and not args.train_files and not args.eval_only:
        raise ConfigError("--dataset files needs --train_files (one TSV or two aligned files).")
    for split in ("train", "validation", "test"):
        files = settings.get(f"{split}_files")
        if files and len(files) not in (1, 2):
            raise ConfigError(f"--{split}_files: give one TSV file or two aligned files, not "
                              f"{len(files)}: {files}.")
    if config.train_steps % settings["steps_per_epoch"]:
        raise ConfigError(f"--train_steps {config.train_steps} must be a multiple of "
                         f"--steps_per_epoch {settings['steps_per_epoch']}.")
    backup = settings["backup_every_steps"]
    if backup < 1 or settings["steps_per_epoch"] % backup:
        raise ConfigError(f"--backup_every_steps {backup} must be at least 1 and divide "
                          f"--steps_per_epoch {settings['steps_per_epoch']}.")
    if settings["eval_beam_size"] < 1:
        raise ConfigError(f"--eval_beam_size {settings['eval_beam_size']}: at least 1 "
                          "(1 decodes greedily).")
    if settings["max_train_length"] > config.max_length:
        raise ConfigError(f"--max_train_length {settings['max_train_length']} is longer than the "
                          f"model's positions (--max_length {config.max_length}): raise "
                          "--max_length or lower --max_train_length.")
    spe = settings["steps_per_execution"]
    if spe < 1 or (backup * settings["grad_accum"]) % spe:
        raise ConfigError(f"--steps_per_execution {spe} must be at least 1 and divide the "
                          f"batches between backups ({backup} x --grad_accum "
                          f"{settings['grad_accum']}).")
    if settings["train_minutes"] is not None and settings["strategy"] == "multi_worker":
        raise ConfigError("--train_minutes is not supported with --strategy multi_worker yet: "
                          "each worker would stop at its own step. Use --train_steps.")
    if spe > 1 and settings["strategy"] in ("mirrored", "multi_worker"):
        raise ConfigError(f"--steps_per_execution {spe} needs --strategy default, one_device "
                          "or tpu: Keras crashes with it under MirroredStrategy on CPUs.")
    return config, settings


# ---- data ------------------------------------------------------------------------------


def split_pairs(settings, split):
    """(source, target) string pairs of a split, as a tf.data.Dataset."""
    from keras_transformer.data import corpora

    if settings["dataset"] == "sample":
        return corpora.sample_dataset(split)
    if settings["dataset"] == "files":
        paths = settings.get(f"{split}_files")
        if not paths:
            raise corpora.DataError(f"--dataset files: no --{split}_files given.")
        counts = SKIP_COUNTS.setdefault(split, corpora.SkipCounts())
        return corpora.files_dataset(paths, counts)
    return corpora.tfds_dataset(settings["tfds_name"], split, settings["source_language"],
                                settings["target_language"], settings["data_dir"])


def get_tokenizer(settings, config, model_dir):
    """The run's vocabulary: model_dir/vocab.model when resuming, else the cached one for this
    corpus and size, trained from the training split the first time."""
    from keras_transformer.tokenizer import Tokenizer, load_or_train_tokenizer

    own = pathlib.Path(model_dir) / "vocab.model"
    if own.exists():
        return Tokenizer.load(own)
    if settings["dataset"] == "files":
        key = "files:" + ",".join(str(pathlib.Path(p).resolve()) for p in settings["train_files"])
    elif settings["dataset"] == "wmt14":
        key = f"{settings['tfds_name']}:{settings['source_language']}"
    else:
        key = "sample"

    def sentences():
        for source, target in split_pairs(settings, "train").as_numpy_iterator():
            yield source.decode("utf-8")
            yield target.decode("utf-8")

    tokenizer = load_or_train_tokenizer(sentences, config.vocab_size, settings["cache_dir"], key)
    return tokenizer


# ---- training --------------------------------------------------------------------------


def checkpoint_dir(model_dir, chief, worker):
    """The chief's checkpoints are the run's; other workers keep theirs apart."""
    return model_dir / "checkpoints" if chief else model_dir / "workers" / worker / "checkpoints"


def validation_batches(settings, config, strategy, tokenizer, static, options):
    """The validation split in length-sorted batches of the training budget (in a fixed
    order; pairs over --max_train_length left out, as in training), for Keras' validation loss
    at every epoch end; None without one."""
    import tensorflow as tf

    from keras_transformer.data import corpora, pipeline

    if settings["no_validation"] or (settings["dataset"] == "files"
                                     and not settings.get("validation_files")):
        return None
    try:
        pairs = split_pairs(settings, "validation")
    except corpora.DataError as error:
        print(f"No validation loss: {error}", flush=True)
        return None
    dataset = pipeline.make_dataset(
        pairs, tokenizer, batch_tokens=settings["batch_tokens"],
        max_length=settings["max_train_length"],
        shuffle=False, static=static, num_replicas=strategy.num_replicas_in_sync,
        pad_id=config.pad_id)
    # Counted once, so that Keras knows where the split ends (else it warns that the input
    # "ran out of data" at every validation).
    count = int(dataset.reduce(0, lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(count)).with_options(options)


def validation_translation(settings, tokenizer, model_dir, copy):
    """The callback that translates the first --eval_sentences validation sentences every
    --eval_every_steps (with `copy`, a `WeightsCopy`) and scores them; None when that is off or
    there is no validation split."""
    from keras_transformer.data import corpora
    from keras_transformer.translator import Translator
    from trainers.evaluation import score
    from trainers.validation import ValidationTranslation

    if not settings["eval_every_steps"] or not settings["eval_sentences"]:
        return None
    try:
        pairs = split_pairs(settings, "validation").take(settings["eval_sentences"])
        pairs = list(pairs.as_numpy_iterator())
    except corpora.DataError as error:
        print(f"No BLEU during training: {error}", flush=True)
        return None
    translators = []

    def make_translator(weights):  # one Translator, so its traced decoding is reused
        model = copy(weights)
        if not translators:
            translators.append(Translator(model, tokenizer, beam_size=settings["eval_beam_size"],
                                          alpha=settings["alpha"], max_extra=settings["max_extra"],
                                          batch_size=settings["eval_batch_size"]))
        return translators[0]

    return ValidationTranslation(
        settings["eval_every_steps"], [s.decode("utf-8") for s, _ in pairs],
        [t.decode("utf-8") for _, t in pairs], make_translator,
        lambda hypotheses, references: score(hypotheses, references), model_dir / "eval",
        model_dir / "logs" / "eval")


def best_checkpoint(settings, model_dir, copy, bleu_evaluated, validated):
    """best/ by --best_metric (loss when BLEU is not evaluated), exported with `copy` (a
    `WeightsCopy`) under --export_on_best; None without validation."""
    from trainers.validation import BestCheckpoint

    metric = settings["best_metric"] if bleu_evaluated else "loss"
    if metric == "loss" and not validated:
        return None
    if not settings["export_on_best"]:
        return BestCheckpoint(model_dir / "best", metric)
    from export.saved_model import export

    def export_best(weights, folder):
        return export(copy(weights), model_dir / "vocab.model", folder,
                      beam_size=settings["beam_size"], alpha=settings["alpha"],
                      max_extra=settings["max_extra"])
    return BestCheckpoint(model_dir / "best", metric, export_best)


def make_callbacks(settings, config, tokenizer, schedule, model_dir, chief, worker,
                   resumable_input, validated, budget=None):
    import keras

    import keras_transformer as kt
    from trainers import artifacts
    from trainers.backup import TrainingBackup
    from trainers.callbacks import Throughput
    from trainers.checkpoints import PeriodicCheckpoint
    from trainers.validation import ValidationLoss

    throughput = Throughput(settings["batch_tokens"])
    callbacks = [
        kt.ScheduleCallback(schedule),
        throughput,
        keras.callbacks.TerminateOnNaN(),
        PeriodicCheckpoint(checkpoint_dir(model_dir, chief, worker),
                           settings["checkpoint_every_steps"],
                           settings["checkpoint_every_minutes"], settings["keep_checkpoints"]),
        TrainingBackup(model_dir / "backup" / worker, resumable_input,
                       settings["backup_every_steps"] * settings["grad_accum"]),
    ]
    if budget is not None:
        callbacks.append(budget)
    if chief:
        # update_freq="epoch": with a step count, Keras 3.15 records no epoch summaries (no
        # validation loss, no learning rate) unless the epoch ends on a multiple of it.
        callbacks.append(keras.callbacks.TensorBoard(str(model_dir / "logs"), update_freq="epoch"))
        copy = artifacts.WeightsCopy(config)  # one model beside the trained one, built on first use
        translation = validation_translation(settings, tokenizer, model_dir, copy)
        best = best_checkpoint(settings, model_dir, copy, translation is not None, validated)
        if translation is not None:
            translation.best, translation.on_pause = best, throughput.exclude
            callbacks.append(translation)
        if validated:
            callbacks.append(ValidationLoss(model_dir / "logs" / "eval",
                                            settings["backup_every_steps"], best))
    return callbacks


def train(settings, config, strategy, tokenizer, model_dir):
    import keras
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.data import pipeline
    from trainers.backup import restore_backup
    from trainers.callbacks import TargetTokens, Throughput, TimeBudget
    from trainers.resumable_input import ResumableInput
    from trainers.strategy import is_chief, worker_id

    chief, worker = is_chief(strategy), worker_id(strategy)
    schedule = kt.TransformerSchedule(config.d_model, config.warmup_steps, settings["lr_scale"])
    with strategy.scope():
        model = kt.Transformer(config)
        model.build()
        optimizer = kt.make_optimizer(
            schedule,
            gradient_accumulation_steps=settings["grad_accum"] if settings["grad_accum"] > 1 else None)
        model.compile(optimizer=optimizer,
                      loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
                      metrics=[kt.MaskedTokenAccuracy(config.pad_id), kt.Perplexity(config.pad_id),
                               TargetTokens(config.pad_id)],
                      jit_compile=settings["jit_compile"],
                      steps_per_execution=settings["steps_per_execution"])
    static = settings["static_batches"] or isinstance(strategy, tf.distribute.TPUStrategy)
    stats = pipeline.PipelineStats()
    options = tf.data.Options()
    options.deterministic = True
    # The pipeline's counters (PipelineStats) are not part of the stream a backup restores.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    batches = pipeline.make_dataset(
        split_pairs(settings, "train"), tokenizer, batch_tokens=settings["batch_tokens"],
        max_length=settings["max_train_length"], seed=settings["seed"], static=static,
        num_replicas=strategy.num_replicas_in_sync, repeat=True, stats=stats, pad_id=config.pad_id,
        batching=settings["batching"])
    resumable_input = ResumableInput(batches.with_options(options))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    dataset = resumable_input.dataset.with_options(options)

    # A Keras epoch is one backup interval; validation comes every --steps_per_epoch.
    interval = settings["backup_every_steps"]
    epochs = config.train_steps // interval
    done = 0
    restored = restore_backup(model_dir / "backup" / worker, model, resumable_input)
    if restored:
        done = restored["epoch"]
        print(f"Resumed at step {restored['step']}: weights, optimizer and input position "
              f"restored in {restored['seconds']:.1f} s ({restored['skipped']} batches read "
              "again to reach the position)", flush=True)
    budget = None
    if settings["train_minutes"] is not None:
        budget = TimeBudget(settings["train_minutes"], model_dir / "backup" / worker / "time.json")
        if budget.exhausted():
            print(f"The time budget of {settings['train_minutes']:g} minutes is used up: "
                  "no more training.", flush=True)
            done = epochs
    if done < epochs:
        validation = validation_batches(settings, config, strategy, tokenizer, static, options)
        callbacks = make_callbacks(settings, config, tokenizer, schedule, model_dir, chief,
                                   worker, resumable_input, validation is not None, budget)
        start = time.monotonic()
        model.fit(dataset, epochs=epochs, initial_epoch=done,
                  steps_per_epoch=interval * settings["grad_accum"],
                  callbacks=callbacks, verbose=settings["verbose"], shuffle=False,
                  validation_data=validation,
                  validation_freq=settings["steps_per_epoch"] // interval)
        throughput = next(c for c in callbacks if isinstance(c, Throughput))
        summary = {**throughput.summary(), "fit_seconds": time.monotonic() - start,
                   "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                   "precision": settings["precision"], "batch_tokens": settings["batch_tokens"]}
        if chief:
            (model_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        if summary.get("real_token_share") is not None:
            print(f"trained to step {summary['steps']}: {summary['tokens_per_second']:,.0f} real "
                  f"target tokens/s, {100 * summary['real_token_share']:.1f}% of the batch budget "
                  "real target tokens", flush=True)
    stats.log()
    for split, counts in SKIP_COUNTS.items():
        counts.log(f"--{split}_files")
    return model


# ---- evaluation ------------------------------------------------------------------------


def evaluate(settings, config, tokenizer, model_dir, model=None):
    """Averages the last checkpoints, translates the evaluation splits with beam search,
    scores them and exports the averaged model (unless --no_export). Returns {split: scores}."""
    from keras_transformer.translator import Translator
    from trainers import artifacts, checkpoints
    from trainers.evaluation import score

    model = model or artifacts.build_model(config)
    found = checkpoints.list_checkpoints(model_dir / "checkpoints")
    if not found:
        raise FileNotFoundError(f"No checkpoints in {model_dir / 'checkpoints'} to evaluate.")
    chosen = found[-settings["average_last"]:]
    checkpoints.average_checkpoints(model, chosen)
    model.save_weights(model_dir / "averaged.weights.h5")
    print(f"Averaged {len(chosen)} checkpoint(s): {', '.join(p.name for p in chosen)}")
    best = model_dir / "best" / "best.json"
    if best.exists():
        record = json.loads(best.read_text())
        print(f"Best during training: step {record['step']}, validation {record['metric']} "
              f"{record['value']:.4g} (in {best.parent})")

    translator = Translator(model, tokenizer, beam_size=settings["beam_size"],
                            alpha=settings["alpha"], max_extra=settings["max_extra"],
                            batch_size=settings["eval_batch_size"])
    results = {}
    out_dir = model_dir / "translations"
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in [s for s in settings["eval_splits"].split(",") if s]:
        pairs = list(split_pairs(settings, split).as_numpy_iterator())
        if settings["eval_max_sentences"]:
            pairs = pairs[:settings["eval_max_sentences"]]
        sources = [s.decode("utf-8") for s, _ in pairs]
        references = [t.decode("utf-8") for _, t in pairs]
        start = time.perf_counter()
        hypotheses = translator.translate(sources)
        seconds = time.perf_counter() - start
        (out_dir / f"{split}.txt").write_text("".join(h + "\n" for h in hypotheses),
                                              encoding="utf-8")
        scores = score(hypotheses, references, settings["tokenized_bleu"])
        scores.update(sentences=len(sources), seconds=seconds)
        results[split] = scores
        print(f"{split}: BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']}), "
              f"chrF = {scores['chrf']:.2f}"
              + (f", tokenized BLEU = {scores['tokenized_bleu']:.2f}"
                 if "tokenized_bleu" in scores else "")
              + f"  [{len(sources)} sentences in {seconds:.0f} s]")
        for source, hypothesis, reference in list(zip(sources, hypotheses, references))[:3]:
            print(f"  {source}\n  -> {hypothesis}\n  (reference: {reference})")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    if not settings["no_export"]:
        from export.saved_model import export

        target = export(model, model_dir / "vocab.model", model_dir / "export",
                        beam_size=settings["beam_size"], alpha=settings["alpha"],
                        max_extra=settings["max_extra"])
        print(f"Exported the averaged model for TF Serving: {target}")
    return results


# ---- main ------------------------------------------------------------------------------


def run(argv=None):
    """The job that `argv` (the command line's words) describes. Returns {split: scores}
    from the final evaluation, or None."""
    return run_parsed(*parse_arguments(argv))


def run_parsed(args, given=()):
    """`run` for parsed flags; `given` names the flags set by the command line or --config
    (with --eval_only the run's own settings fill in the others)."""
    from trainers import artifacts

    if args.eval_only:
        preset = args.preset or DATASET_DEFAULTS[args.dataset]["preset"]
        model_dir = pathlib.Path(args.model_dir or f"runs/{args.dataset}-{preset}")
        saved_config, saved = artifacts.read_run_config(model_dir)
        for key, value in {**saved, **saved_config.to_dict()}.items():
            if key not in given and key not in RUN_ONLY and hasattr(args, key):
                setattr(args, key, value)
        args.model_dir = str(model_dir)
    config, settings = resolve_settings(args)

    import keras
    import tensorflow as tf

    from trainers.strategy import is_chief, resolve_strategy, split_cpu

    if settings["logical_cpus"]:
        split_cpu(settings["logical_cpus"])
    keras.utils.set_random_seed(settings["seed"])
    if settings["deterministic"]:
        tf.config.experimental.enable_op_determinism()
    strategy = resolve_strategy(settings["strategy"], settings["tpu"])
    from trainers.precision import choose_precision

    precision, why = choose_precision(settings["precision"], strategy)
    settings["precision"] = precision
    keras.mixed_precision.set_global_policy(precision)
    print(f"precision {precision} ({why})", flush=True)
    model_dir = pathlib.Path(settings["model_dir"])

    if settings["eval_only"]:
        config, _ = artifacts.read_run_config(model_dir)
        return evaluate(settings, config, artifacts.load_tokenizer(model_dir), model_dir)

    tokenizer = get_tokenizer(settings, config, model_dir)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    artifacts.check_same_shape(model_dir, config)
    if is_chief(strategy):
        tokenizer.save(model_dir / "vocab.model")
        artifacts.write_run_config(model_dir, config, settings)
    print(f"{settings['preset']} model: {config.num_layers}+{config.num_layers} layers, "
          f"d_model {config.d_model}, vocab {config.vocab_size}; strategy {settings['strategy']} "
          f"({strategy.num_replicas_in_sync} replica(s)); {config.train_steps} steps of "
          f"{settings['batch_tokens']} tokens; model_dir {model_dir}", flush=True)
    train(settings, config, strategy, tokenizer, model_dir)
    if settings["no_eval"] or not is_chief(strategy):
        return None
    # A fresh model, built outside the strategy's scope and without the training state,
    # translates and exports (the trained one failed to retrace beam search in this process).
    return evaluate(settings, config, tokenizer, model_dir, artifacts.build_model(config))


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
    sys.exit(main())
