"""What a training run is set to, beside the model: `RunSettings`, whose fields are the command
line's flags (each field holds its flag's group, help and choices: a new flag is one field
here), the defaults that depend on --dataset, and the checks of settings that cannot work
together. Imports neither TensorFlow nor Keras, so `--help` answers at once."""

import dataclasses
import importlib.util
import pathlib
import sys
import typing

from trainers.strategy import STRATEGIES


def light_config():
    """keras_transformer/config.py, loaded alone: the package's __init__ imports Keras (it
    registers the layers with it), and `--help` should not. For the presets, the
    TransformerConfig fields and their help; the settings themselves use the real module."""
    package = importlib.util.find_spec("keras_transformer").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("_keras_transformer_config",
                                                  pathlib.Path(package) / "config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CONFIG = light_config()

EVAL_SPLITS = ("validation", "test")  # the splits the final evaluation can translate

DATASET_DEFAULTS = {
    # Sized so that the main job runs in a few minutes on two CPU cores.
    # Its sentence templates are nearly fixed by their length: batches of one length learn
    # slowly there, so each row holds several pairs of mixed lengths (batching "concat", see
    # keras_transformer/data/pipeline.py).
    "sample": dict(preset="tiny", vocab_size=2000, batch_tokens=2048, max_train_length=64,
                   batching="concat",
                   train_steps=170, warmup_steps=130, lr_scale=0.5, validate_every_steps=85,
                   backup_every_steps=85, checkpoint_every_steps=34, average_last=2,
                   eval_splits="test", eval_every_steps=85, eval_sentences=100),
    # §5: 25,000 source and 25,000 target tokens per batch, sequences up to 256 pieces.
    "wmt14": dict(preset="base", vocab_size=37000, batch_tokens=25000, max_train_length=256,
                  batching="packed",
                  validate_every_steps=1000, backup_every_steps=250, checkpoint_every_steps=None,
                  average_last=None, eval_splits="validation,test", eval_every_steps=5000,
                  eval_sentences=500),
}
DATASET_DEFAULTS["files"] = dict(DATASET_DEFAULTS["wmt14"])

# Flags that were renamed: the old name still works on the command line and in --config
# files (and a run's config.json written before the rename).
RENAMED = {"steps_per_epoch": "validate_every_steps"}

DISTRIBUTION = "distribution and precision"
MODEL = "model (Table 3): a preset plus overrides"
DATA = "data"
TRAINING = "training"
EVALUATION = "evaluation during training"
FINAL = "final evaluation"


def flag(group, help, default=None, *, run_only=False, **argparse_options):
    """A `RunSettings` field and its flag `--<field name>`: `group` and `help` as --help shows
    them, `argparse_options` (choices, metavar, ...) passed to `add_argument`. The flag's type
    comes from the field's annotation (bool: a switch; list: one or more values). `run_only`:
    the setting describes the process, not the run (not read back from a run's config.json)."""
    return dataclasses.field(default=default, metadata=dict(
        group=group, help=help, run_only=run_only, argparse=argparse_options))


@dataclasses.dataclass
class RunSettings:
    """Everything about a run that is not the model (`TransformerConfig`), one field per flag
    (see --help for each), with the --dataset and --preset defaults filled in by
    `resolve_settings`. Written to model_dir/config.json as "run"."""

    config: str | None = flag(
        None, "a .yaml or .json file of flag values (keys as the flags, without --), e.g. a "
        "run's own config.json; flags given here override it", metavar="FILE", run_only=True)

    strategy: str = flag(
        DISTRIBUTION, "tf.distribute strategy: mirrored uses every local GPU (or "
        "--logical_cpus), multi_worker reads TF_CONFIG", "default", choices=STRATEGIES)
    tpu: str | None = flag(DISTRIBUTION, "TPU name or grpc:// address ('local' on a TPU VM)")
    logical_cpus: int | None = flag(
        DISTRIBUTION, "split the CPU into N devices (mirrored replicas without GPUs)")
    precision: str = flag(
        DISTRIBUTION, "auto: mixed_bfloat16 on TPUs, GPUs and CPUs with native bfloat16 (AMX, "
        "AVX512-BF16), mixed_float16 on GPUs of compute capability 7.x (V100, T4), float32 "
        "elsewhere", "auto", choices=("auto", "float32", "mixed_float16", "mixed_bfloat16"))
    steps_per_execution: int | None = flag(
        DISTRIBUTION, "train steps per call into the graph (default: the largest of 1-5 that "
        "divides the batches between backups; 1 with several mirrored or multi-worker "
        "replicas, where Keras crashes with more)")
    jit_compile: bool = flag(DISTRIBUTION, "compile the train step with XLA", False)
    static_batches: bool = flag(
        DISTRIBUTION, "bucketed static shapes (implied by --strategy tpu)", False)
    batching: str = flag(
        DISTRIBUTION, "packed: batches of one target length filling the budget; mixed: "
        "batches of mixed lengths; concat: several pairs per row of --max_train_length "
        "tokens, kept apart by masks", choices=_CONFIG.BATCHING)
    deterministic: bool = flag(
        DISTRIBUTION, "enable op determinism (a resumed run then ends with the same weights "
        "as an uninterrupted one)", False)
    seed: int = flag(DISTRIBUTION, "seeds weights, dropout and shuffling", 0)

    # The preset the TransformerConfig starts from; the model group's other flags are the
    # TransformerConfig fields (trainers/command_line.py).
    preset: str = flag(MODEL, "model size", choices=sorted(_CONFIG.PRESETS))

    dataset: str = flag(
        DATA, "wmt14: TFDS wmt14_translate; sample: the embedded sample corpus; files: "
        "--train_files etc.", "wmt14", choices=tuple(DATASET_DEFAULTS))
    tfds_name: str = flag(DATA, "TFDS dataset name", "wmt14_translate/de-en")
    data_dir: str | None = flag(DATA, "TFDS data_dir with a prepared copy")
    source_language: str = flag(DATA, "language translated from", "en")
    target_language: str | None = flag(DATA, "default: the other language")
    train_files: list[str] | None = flag(
        DATA, "--dataset files: the train split, one TSV or two aligned files", metavar="FILE")
    validation_files: list[str] | None = flag(
        DATA, "--dataset files: the validation split, one TSV or two aligned files",
        metavar="FILE")
    test_files: list[str] | None = flag(
        DATA, "--dataset files: the test split, one TSV or two aligned files", metavar="FILE")
    batch_tokens: int = flag(
        DATA, "source (and target) tokens per global batch, padding included")
    max_train_length: int = flag(
        DATA, "longest training source or target kept, in pieces (with BOS/EOS)")
    cache_dir: str = flag(DATA, "where vocabularies are cached",
                          str(pathlib.Path.home() / ".cache" / "keras-transformer"))

    model_dir: str = flag(TRAINING, "default: runs/<dataset>-<preset>", run_only=True)
    lr_scale: float = flag(TRAINING, "multiplies the §5.3 learning rate; 1 is the paper")
    grad_accum: int = flag(
        TRAINING, "accumulate gradients over N batches (N x batch_tokens per update)", 1)
    validate_every_steps: int = flag(
        TRAINING, "steps between validation losses (a multiple of --backup_every_steps); "
        "--steps_per_epoch is its old name, still accepted")
    backup_every_steps: int = flag(
        TRAINING, "steps between backups of the training state (weights, optimizer, input "
        "position) and progress summaries")
    checkpoint_every_steps: int | None = flag(
        TRAINING, "steps between the checkpoints that are averaged")
    train_minutes: float | None = flag(
        TRAINING, "stop training after M minutes (resumed runs continue the budget), then "
        "average, evaluate and export as usual")
    checkpoint_every_minutes: float = flag(
        TRAINING, "also checkpoint every M minutes (the paper: 10)", 10.0)
    keep_checkpoints: int = flag(TRAINING, "checkpoints kept in model_dir/checkpoints", 20)
    train_metrics: bool = flag(
        TRAINING, "also compute token accuracy and perplexity on every training batch (a pass "
        "over the [tokens, vocabulary] logits each); the validation reports them either way",
        False)
    verbose: int = flag(
        TRAINING, "Keras progress: 1 a bar (default on a terminal), 2 a line per backup "
        "interval (default otherwise)", choices=(0, 1, 2), run_only=True)

    no_validation: bool = flag(
        EVALUATION, "skip the validation loss and perplexity at every --validate_every_steps",
        False)
    eval_every_steps: int = flag(
        EVALUATION, "translate the first --eval_sentences validation sentences and log BLEU "
        "and chrF every N steps (0: never)")
    eval_sentences: int = flag(
        EVALUATION, "validation sentences translated at every --eval_every_steps")
    eval_beam_size: int = flag(EVALUATION, "beam size of those translations (1: greedy)", 1)
    best_metric: str = flag(
        EVALUATION, "what model_dir/best/ keeps the best step by (validation BLEU, or "
        "validation loss; loss when BLEU is not evaluated)", "bleu", choices=("bleu", "loss"))
    export_on_best: bool = flag(
        EVALUATION, "export best/ for TF Serving (best/export/<version>) each time it "
        "improves", False)

    eval_only: bool = flag(
        FINAL, "evaluate --model_dir (with the run's own settings) and stop", False,
        run_only=True)
    no_eval: bool = flag(FINAL, "skip the final evaluation", False)
    no_export: bool = flag(
        FINAL, "skip exporting the averaged model (model_dir/export/<version>)", False)
    average_last: int = flag(
        FINAL, "checkpoints to average (§6.1: 5 for base, 20 for big; 2 for --dataset "
        "sample)")
    eval_splits: str = flag(FINAL, "comma-separated: validation, test; empty for none")
    eval_max_sentences: int | None = flag(FINAL, "translate at most N sentences per split")
    beam_size: int = flag(FINAL, "§6.1 beam size", 4)
    alpha: float = flag(FINAL, "§6.1 length penalty alpha", 0.6)
    max_extra: int = flag(FINAL, "longest output: input length + N (§6.1)", 50)
    eval_batch_size: int = flag(FINAL, "sentences per batch", 64)
    tokenized_bleu: bool = flag(
        FINAL, "also report the paper's tokenized BLEU with compound splitting", False)

    # What --precision resolved to on this machine, and why (`precision` stays as asked, so
    # a config.json of an `auto` run is `auto` on other hardware too). Not flags.
    precision_chosen: str | None = dataclasses.field(default=None, metadata={"run_only": True})
    precision_reason: str | None = dataclasses.field(default=None, metadata={"run_only": True})
    # What --steps_per_execution resolved to for the strategy's replicas (`choose_execution`).
    steps_per_execution_chosen: int | None = dataclasses.field(
        default=None, metadata={"run_only": True})

    def batches_between_backups(self):
        """Batches read between two backups: --backup_every_steps updates of --grad_accum
        batches each (a Keras epoch)."""
        return self.backup_every_steps * self.grad_accum

    def eval_split_names(self):
        """--eval_splits as a list of names, spaces and empty entries dropped."""
        return [split for split in map(str.strip, self.eval_splits.split(",")) if split]

    def to_dict(self):
        return dataclasses.asdict(self)


FLAGS = tuple(f for f in dataclasses.fields(RunSettings) if "group" in f.metadata)

# Settings of a run that describe the process rather than the run, left out when a run's
# config.json is read back.
RUN_ONLY = tuple(f.name for f in dataclasses.fields(RunSettings) if f.metadata["run_only"])

# The settings whose defaults depend on --dataset (DATASET_DEFAULTS).
PER_DATASET_SETTINGS = tuple(f.name for f in FLAGS
                             if any(f.name in d for d in DATASET_DEFAULTS.values()))


def flag_type(field):
    """(type, is_list) of a field's flag, from its annotation: `int | None` -> (int, False),
    `list[str] | None` -> (str, True)."""
    kinds = [t for t in typing.get_args(field.type) if t is not type(None)] or [field.type]
    kind = kinds[0]
    if typing.get_origin(kind) is list:
        return typing.get_args(kind)[0], True
    return kind, False


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
    values = {f.name: getattr(args, f.name) for f in FLAGS}
    values.update({k: defaults.get(k) for k in PER_DATASET_SETTINGS if values.get(k) is None})
    values["lr_scale"] = values["lr_scale"] or 1.0
    values["validate_every_steps"] = min(values["validate_every_steps"], config.train_steps)
    if args.backup_every_steps is None:  # the largest divisor of the interval up to the default
        interval = values["validate_every_steps"]
        values["backup_every_steps"] = max(
            n for n in range(1, min(values["backup_every_steps"], interval) + 1)
            if interval % n == 0)
    values["average_last"] = values["average_last"] or (20 if preset == "big" else 5)
    values["preset"] = preset
    if values["verbose"] is None:
        values["verbose"] = 1 if sys.stdout.isatty() else 2
    values["model_dir"] = values["model_dir"] or f"runs/{args.dataset}-{preset}"
    settings = RunSettings(**values)
    check_settings(config, settings)
    return config, settings


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
    if config.train_steps % s.validate_every_steps:
        raise ConfigError(f"--train_steps {config.train_steps} must be a multiple of "
                          f"--validate_every_steps {s.validate_every_steps}.")
    if s.backup_every_steps < 1 or s.validate_every_steps % s.backup_every_steps:
        raise ConfigError(f"--backup_every_steps {s.backup_every_steps} must be at least 1 and "
                          f"divide --validate_every_steps {s.validate_every_steps}.")
    unknown = [split for split in s.eval_split_names() if split not in EVAL_SPLITS]
    if unknown:
        raise ConfigError(f"--eval_splits {s.eval_splits!r}: {', '.join(unknown)} is not a "
                          f"split; give some of {', '.join(EVAL_SPLITS)}, comma-separated, or "
                          "'' for no final evaluation (or --no_eval).")
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
    if spe is not None and (spe < 1 or s.batches_between_backups() % spe):
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


# Several steps per call into the graph save the host's time between steps, and five already
# save most of it (benchmarks/results/steps_per_execution_*.md).
AUTO_STEPS_PER_EXECUTION = 5


def choose_execution(s, replicas):
    """Sets `s.steps_per_execution_chosen` for a strategy of `replicas` replicas: the flag, or
    by default the largest of 1-5 that divides the batches between backups (so that backups
    and the time budget land on a call's end). Raises ConfigError for more than one step per
    call with several mirrored or multi-worker replicas: Keras 3.15's multi-step function then
    fails in the graph ("You must feed a value for placeholder tensor ... while/cond")."""
    from keras_transformer.config import ConfigError

    several = replicas > 1 and s.strategy in ("mirrored", "multi_worker")
    if s.steps_per_execution is None:
        batches = s.batches_between_backups()
        s.steps_per_execution_chosen = 1 if several else max(
            n for n in range(1, AUTO_STEPS_PER_EXECUTION + 1) if batches % n == 0)
        return
    if several and s.steps_per_execution > 1:
        raise ConfigError(f"--steps_per_execution {s.steps_per_execution} needs one replica "
                          f"under --strategy {s.strategy} (this one has {replicas}): Keras "
                          "crashes with more. Leave the flag out, or set it to 1.")
    s.steps_per_execution_chosen = s.steps_per_execution
