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
    """keras_transformer/config.py, loaded alone: the package's __init__ imports Keras and
    keras-hub (it registers the layers with them), and `--help` should answer at once."""
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
    """The command line: one flag per setting, grouped as --help shows them."""
    config = _light_config()
    parser = argparse.ArgumentParser(prog="python -m trainers.wmt", description=__doc__,
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a .yaml or .json file of flag values (keys as the flags, without "
                             "--), e.g. a run's own config.json; flags given here override it")
    _distribution_flags(parser.add_argument_group("distribution and precision"))
    _model_flags(parser.add_argument_group("model (Table 3): a preset plus overrides"), config)
    _data_flags(parser.add_argument_group("data"))
    _training_flags(parser.add_argument_group("training"))
    _evaluation_flags(parser.add_argument_group("evaluation during training"))
    _final_evaluation_flags(parser.add_argument_group("final evaluation"))
    return parser


def _distribution_flags(run):
    """--strategy, --precision and how the train step runs."""
    run.add_argument("--strategy", choices=STRATEGIES, default="default",
                     help="tf.distribute strategy: mirrored uses every local GPU (or "
                          "--logical_cpus), multi_worker reads TF_CONFIG")
    run.add_argument("--tpu", default=None, help="TPU name or grpc:// address ('local' on a TPU VM)")
    run.add_argument("--logical_cpus", type=int, default=None,
                     help="split the CPU into N devices (mirrored replicas without GPUs)")
    run.add_argument("--precision", choices=PRECISIONS, default="auto",
                     help="auto: mixed_bfloat16 on TPUs, GPUs and CPUs with native bfloat16 "
                          "(AMX, AVX512-BF16), mixed_float16 on GPUs of compute capability "
                          "7.x (V100, T4), float32 elsewhere")
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


def _model_flags(model, config):
    """--preset and one flag per TransformerConfig field (`config`: keras_transformer/config.py)."""
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


def _data_flags(data):
    """--dataset and where its splits, vocabulary and batches come from."""
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


def _training_flags(train):
    """--model_dir, the learning rate, checkpoints, backups and the time budget."""
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


def _evaluation_flags(evaluate):
    """Validation loss, BLEU every N steps and best/."""
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


def _final_evaluation_flags(final):
    """Checkpoint averaging, beam search and export at the end."""
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
RUN_ONLY = ("eval_only", "model_dir", "verbose", "config", "precision_chosen",
            "precision_reason")


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


@dataclasses.dataclass
class RunSettings:
    """Everything about a run that is not the model (`TransformerConfig`): the flags of the
    same names (see --help for each), with the --dataset and --preset defaults filled in by
    `resolve_settings`. Written to model_dir/config.json as "run"."""

    # distribution and precision
    strategy: str
    tpu: str | None
    logical_cpus: int | None
    precision: str
    steps_per_execution: int
    jit_compile: bool
    static_batches: bool
    batching: str
    deterministic: bool
    seed: int
    # model: the preset the TransformerConfig started from
    preset: str
    # data
    dataset: str
    tfds_name: str
    data_dir: str | None
    source_language: str
    target_language: str | None
    train_files: list[str] | None
    validation_files: list[str] | None
    test_files: list[str] | None
    batch_tokens: int
    max_train_length: int
    cache_dir: str
    # training
    model_dir: str
    lr_scale: float
    grad_accum: int
    steps_per_epoch: int
    backup_every_steps: int
    checkpoint_every_steps: int | None
    train_minutes: float | None
    checkpoint_every_minutes: float
    keep_checkpoints: int
    verbose: int
    # evaluation during training
    no_validation: bool
    eval_every_steps: int
    eval_sentences: int
    eval_beam_size: int
    best_metric: str
    export_on_best: bool
    # final evaluation
    eval_only: bool
    no_eval: bool
    no_export: bool
    average_last: int
    eval_splits: str
    eval_max_sentences: int | None
    beam_size: int
    alpha: float
    max_extra: int
    eval_batch_size: int
    tokenized_bleu: bool
    config: str | None = None  # the --config file the flags came from, if any
    # What --precision resolved to on this machine, and why (`precision` stays as asked, so
    # a config.json of an `auto` run is `auto` on other hardware too).
    precision_chosen: str | None = None
    precision_reason: str | None = None

    def to_dict(self):
        return dataclasses.asdict(self)


def resolve_settings(args):
    """(TransformerConfig, RunSettings) of parsed flags: the command line over the dataset's
    defaults over the preset. Raises ConfigError for settings that cannot work together."""
    from keras_transformer.config import TransformerConfig

    defaults = DATASET_DEFAULTS[args.dataset]
    preset = args.preset or defaults["preset"]
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    overrides = {k: v for k, v in defaults.items() if k in fields}
    overrides.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    config = TransformerConfig.preset(preset, **overrides)
    values = {k: v for k, v in vars(args).items() if k not in fields}
    values.update({k: defaults.get(k) for k in PER_DATASET_SETTINGS if values.get(k) is None})
    values["lr_scale"] = values["lr_scale"] or 1.0
    values["steps_per_epoch"] = min(values["steps_per_epoch"], config.train_steps)
    if args.backup_every_steps is None:  # the largest divisor of an epoch up to the default
        values["backup_every_steps"] = max(
            n for n in range(1, min(values["backup_every_steps"], values["steps_per_epoch"]) + 1)
            if values["steps_per_epoch"] % n == 0)
    values["average_last"] = values["average_last"] or (20 if preset == "big" else 5)
    values["preset"] = preset
    if values["verbose"] is None:
        values["verbose"] = 1 if sys.stdout.isatty() else 2
    values["model_dir"] = values["model_dir"] or f"runs/{args.dataset}-{preset}"
    settings = RunSettings(**values)
    check_settings(config, settings)
    return config, settings


# The settings whose defaults depend on --dataset (DATASET_DEFAULTS).
PER_DATASET_SETTINGS = ("batch_tokens", "max_train_length", "lr_scale", "steps_per_epoch",
                        "backup_every_steps", "checkpoint_every_steps", "average_last",
                        "eval_splits", "batching", "eval_every_steps", "eval_sentences")


def check_settings(config, settings):
    """Raises ConfigError, naming the flags, for settings that cannot work together."""
    from keras_transformer.config import ConfigError

    s = settings
    if s.dataset == "files" and not s.train_files and not s.eval_only:
        raise ConfigError("--dataset files needs --train_files (one TSV or two aligned files).")
    for split in ("train", "validation", "test"):
        files = getattr(s, f"{split}_files")
        if files and len(files) not in (1, 2):
            raise ConfigError(f"--{split}_files: give one TSV file or two aligned files, not "
                              f"{len(files)}: {files}.")
    if config.train_steps % s.steps_per_epoch:
        raise ConfigError(f"--train_steps {config.train_steps} must be a multiple of "
                          f"--steps_per_epoch {s.steps_per_epoch}.")
    if s.backup_every_steps < 1 or s.steps_per_epoch % s.backup_every_steps:
        raise ConfigError(f"--backup_every_steps {s.backup_every_steps} must be at least 1 and "
                          f"divide --steps_per_epoch {s.steps_per_epoch}.")
    if s.eval_beam_size < 1:
        raise ConfigError(f"--eval_beam_size {s.eval_beam_size}: at least 1 (1 decodes "
                          "greedily).")
    if s.max_train_length > config.max_length:
        raise ConfigError(f"--max_train_length {s.max_train_length} is longer than the model's "
                          f"positions (--max_length {config.max_length}): raise --max_length "
                          "or lower --max_train_length.")
    _check_execution(s)


def _check_execution(s):
    """--steps_per_execution and --train_minutes against the strategy and the backups."""
    from keras_transformer.config import ConfigError

    spe = s.steps_per_execution
    if spe < 1 or (s.backup_every_steps * s.grad_accum) % spe:
        raise ConfigError(f"--steps_per_execution {spe} must be at least 1 and divide the "
                          f"batches between backups ({s.backup_every_steps} x --grad_accum "
                          f"{s.grad_accum}).")
    if s.train_minutes is not None and s.strategy == "multi_worker":
        raise ConfigError("--train_minutes is not supported with --strategy multi_worker yet: "
                          "each worker would stop at its own step. Use --train_steps.")
    if s.grad_accum > 1 and s.strategy in ("mirrored", "multi_worker"):
        # Keras 3.15's accumulation updates the weights inside ops.cond, and a mirrored
        # variable's update there needs a merge_call, which TensorFlow refuses in a cond
        # ("`merge_call` called while defining a new graph"); plain Keras Adam fails alike.
        raise ConfigError(f"--grad_accum {s.grad_accum} does not work with --strategy "
                          f"{s.strategy} (Keras' gradient accumulation crashes under "
                          "MirroredStrategy): raise --batch_tokens instead, or use --strategy "
                          "default, one_device or tpu.")
    if spe > 1 and s.strategy in ("mirrored", "multi_worker"):
        raise ConfigError(f"--steps_per_execution {spe} needs --strategy default, one_device "
                          "or tpu: Keras crashes with it under MirroredStrategy on CPUs.")


# ---- main ------------------------------------------------------------------------------


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
        if key not in given and key not in RUN_ONLY and hasattr(args, key):
            setattr(args, key, value)
    args.model_dir = str(model_dir)


def start_tensorflow(settings):
    """Seeds, determinism, the strategy and the precision policy; returns the strategy."""
    import keras
    import tensorflow as tf

    from trainers.precision import choose_precision
    from trainers.strategy import resolve_strategy, split_cpu

    if settings.logical_cpus:
        split_cpu(settings.logical_cpus)
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = resolve_strategy(settings.strategy, settings.tpu)
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
    from trainers.corpus import get_tokenizer
    from trainers.final_evaluation import evaluate
    from trainers.strategy import is_chief
    from trainers.training import train

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
          f"({strategy.num_replicas_in_sync} replica(s)); {config.train_steps} steps of "
          f"{settings.batch_tokens} tokens; model_dir {model_dir}", flush=True)
    train(settings, config, strategy, tokenizer, model_dir)
    if settings.no_eval or not is_chief(strategy):
        return None
    return evaluate(settings, config, tokenizer, model_dir)


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
