"""Train the Transformer on WMT 2014 English-German (or the embedded sample corpus, or your
own files) under any tf.distribute strategy, then average checkpoints and report BLEU.

    python -m trainers.wmt --strategy mirrored --dataset sample      # minutes, on a CPU
    python -m trainers.wmt --strategy mirrored --preset base          # the paper's base model

A killed run started again with the same command resumes where it was (BackupAndRestore plus
a replay of the input pipeline to the same position). `--eval_only` re-evaluates a model_dir.
"""

import argparse
import dataclasses
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
                   checkpoint_every_steps=34, average_last=2, eval_splits="test"),
    # §5: 25,000 source and 25,000 target tokens per batch, sequences up to 256 pieces.
    "wmt14": dict(preset="base", vocab_size=37000, batch_tokens=25000, max_train_length=256,
                  batching="packed",
                  steps_per_epoch=1000, checkpoint_every_steps=None, average_last=None,
                  eval_splits="validation,test"),
}
DATASET_DEFAULTS["files"] = dict(DATASET_DEFAULTS["wmt14"])
SKIP_COUNTS = {}  # --dataset files: lines skipped per split, counted as the data is read
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def _bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser():
    from keras_transformer.config import PRESETS, TransformerConfig
    from trainers.strategy import STRATEGIES

    parser = argparse.ArgumentParser(prog="python -m trainers.wmt",
                                     description=__doc__.split("\n\n")[0])
    run = parser.add_argument_group("distribution and precision")
    run.add_argument("--strategy", choices=STRATEGIES, default="default")
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
                     help="packed: batches of one target length filling the budget (default); "
                          "mixed: batches of mixed lengths; concat: several pairs per row of "
                          "--max_train_length tokens, kept apart by masks (default for "
                          "--dataset sample)")
    run.add_argument("--deterministic", action="store_true", help="enable op determinism")
    run.add_argument("--seed", type=int, default=0)

    model = parser.add_argument_group("model (Table 3): a preset plus overrides")
    model.add_argument("--preset", choices=sorted(PRESETS), default=None,
                       help="default: tiny for --dataset sample, base otherwise")
    for field in dataclasses.fields(TransformerConfig):
        kind = {bool: _bool, int: int, float: float, str: str}.get(field.type, int)  # int | None
        choices = ("sinusoidal", "learned") if field.name == "position" else None
        # A bare boolean flag (`--norm_first`) means true; `--norm_first false` also works.
        bare = dict(nargs="?", const=True) if kind is _bool else {}
        model.add_argument(f"--{field.name}", type=kind, default=None, choices=choices, **bare)

    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=("wmt14", "sample", "files"), default="wmt14")
    data.add_argument("--tfds_name", default="wmt14_translate/de-en")
    data.add_argument("--data_dir", default=None, help="TFDS data_dir with a prepared copy")
    data.add_argument("--source_language", default="en")
    data.add_argument("--target_language", default=None, help="default: the other language")
    for split in ("train", "validation", "test"):
        data.add_argument(f"--{split}_files", nargs="+", default=None, metavar="FILE",
                          help=f"--dataset files: the {split} split, one TSV or two aligned files")
    data.add_argument("--batch_tokens", type=int, default=None,
                      help="source (and target) tokens per global batch, padding included")
    data.add_argument("--max_train_length", type=int, default=None,
                      help="longest training source or target kept, in pieces (with BOS/EOS)")
    data.add_argument("--cache_dir", default=str(pathlib.Path.home() / ".cache" / "keras-transformer"),
                      help="where vocabularies are cached")

    train = parser.add_argument_group("training")
    train.add_argument("--model_dir", default=None, help="default: runs/<dataset>-<preset>")
    train.add_argument("--lr_scale", type=float, default=None,
                       help="multiplies the §5.3 learning rate (default 1, the paper)")
    train.add_argument("--grad_accum", type=int, default=1,
                       help="accumulate gradients over N batches (N x batch_tokens per update)")
    train.add_argument("--steps_per_epoch", type=int, default=None,
                       help="steps between progress summaries and BackupAndRestore saves")
    train.add_argument("--checkpoint_every_steps", type=int, default=None)
    train.add_argument("--train_minutes", type=float, default=None,
                       help="stop training after M minutes (resumed runs continue the budget), "
                            "then average, evaluate and export as usual")
    train.add_argument("--checkpoint_every_minutes", type=float, default=10.0)
    train.add_argument("--keep_checkpoints", type=int, default=20)
    train.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None,
                       help="Keras progress: 1 a bar (default on a terminal), 2 a line per epoch")

    evaluate = parser.add_argument_group("evaluation")
    evaluate.add_argument("--eval_only", action="store_true")
    evaluate.add_argument("--no_validation", action="store_true",
                          help="skip the validation loss at every --steps_per_epoch boundary "
                               "(computed on the validation split when it exists)")
    evaluate.add_argument("--no_eval", action="store_true")
    evaluate.add_argument("--no_export", action="store_true",
                          help="skip exporting the averaged model (model_dir/export/<version>)")
    evaluate.add_argument("--average_last", type=int, default=None,
                          help="checkpoints to average (default 5 for base, 20 for big)")
    evaluate.add_argument("--eval_splits", default=None,
                          help="comma-separated (default: test for sample, else validation,test)")
    evaluate.add_argument("--eval_max_sentences", type=int, default=None)
    evaluate.add_argument("--beam_size", type=int, default=4)
    evaluate.add_argument("--alpha", type=float, default=0.6)
    evaluate.add_argument("--max_extra", type=int, default=50)
    evaluate.add_argument("--eval_batch_size", type=int, default=64)
    evaluate.add_argument("--tokenized_bleu", action="store_true",
                          help="also report the paper's tokenized BLEU with compound splitting")
    return parser


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
                "checkpoint_every_steps", "average_last", "eval_splits", "batching"):
        if settings.get(key) is None:
            settings[key] = defaults.get(key)
    settings["lr_scale"] = settings["lr_scale"] or 1.0
    settings["steps_per_epoch"] = min(settings["steps_per_epoch"], config.train_steps)
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
    if settings["max_train_length"] > config.max_length:
        raise ConfigError(f"--max_train_length {settings['max_train_length']} is longer than the "
                          f"model's positions (--max_length {config.max_length}): raise "
                          "--max_length or lower --max_train_length.")
    spe = settings["steps_per_execution"]
    if spe < 1 or (settings["steps_per_epoch"] * settings["grad_accum"]) % spe:
        raise ConfigError(f"--steps_per_execution {spe} must be at least 1 and divide the "
                          f"batches of an epoch ({settings['steps_per_epoch']} x --grad_accum "
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
    return dataset.with_options(options)


def make_callbacks(settings, schedule, model_dir, chief, worker, budget=None):
    import keras

    import keras_transformer as kt
    from trainers.callbacks import Throughput
    from trainers.checkpoints import PeriodicCheckpoint

    callbacks = [
        # First: it restores the weights and the optimizer's step the others count from.
        keras.callbacks.BackupAndRestore(str(model_dir / "backup" / worker),
                                         save_freq="epoch", delete_checkpoint=False),
        kt.ScheduleCallback(schedule),
        Throughput(settings["batch_tokens"]),
        keras.callbacks.TerminateOnNaN(),
        PeriodicCheckpoint(checkpoint_dir(model_dir, chief, worker),
                           settings["checkpoint_every_steps"],
                           settings["checkpoint_every_minutes"], settings["keep_checkpoints"]),
    ]
    if budget is not None:
        callbacks.append(budget)
    if chief:
        # update_freq="epoch": with a step count, Keras 3.15 records no epoch summaries (no
        # validation loss, no learning rate) unless the epoch ends on a multiple of it.
        callbacks.append(keras.callbacks.TensorBoard(str(model_dir / "logs"), update_freq="epoch"))
    return callbacks


def train(settings, config, strategy, tokenizer, model_dir):
    import keras
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.data import pipeline
    from trainers.callbacks import TargetTokens, Throughput, TimeBudget
    from trainers.checkpoints import epochs_done
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
                      metrics=[kt.MaskedTokenAccuracy(config.pad_id), TargetTokens(config.pad_id)],
                      jit_compile=settings["jit_compile"],
                      steps_per_execution=settings["steps_per_execution"])
    static = settings["static_batches"] or isinstance(strategy, tf.distribute.TPUStrategy)
    stats = pipeline.PipelineStats()
    dataset = pipeline.make_dataset(
        split_pairs(settings, "train"), tokenizer, batch_tokens=settings["batch_tokens"],
        max_length=settings["max_train_length"], seed=settings["seed"], static=static,
        num_replicas=strategy.num_replicas_in_sync, repeat=True, stats=stats, pad_id=config.pad_id,
        batching=settings["batching"])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    dataset = dataset.with_options(options)

    steps_per_epoch = settings["steps_per_epoch"]
    done = epochs_done(model_dir / "backup" / worker)
    epochs = config.train_steps // steps_per_epoch
    if done:
        print(f"Resuming after epoch {done} (step {done * steps_per_epoch}): replaying the "
              "input pipeline to that position.", flush=True)
        dataset = dataset.skip(done * steps_per_epoch * settings["grad_accum"])
    budget = None
    if settings["train_minutes"] is not None:
        budget = TimeBudget(settings["train_minutes"], model_dir / "backup" / worker / "time.json")
        if budget.exhausted():
            print(f"The time budget of {settings['train_minutes']:g} minutes is used up: "
                  "no more training.", flush=True)
            done = epochs
    if done < epochs:
        callbacks = make_callbacks(settings, schedule, model_dir, chief, worker, budget)
        start = time.monotonic()
        model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch * settings["grad_accum"],
                  callbacks=callbacks, verbose=settings["verbose"], shuffle=False,
                  validation_data=validation_batches(settings, config, strategy, tokenizer,
                                                     static, options))
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
    args = build_parser().parse_args(argv)
    config, settings = resolve_settings(args)

    import keras
    import tensorflow as tf

    from trainers import artifacts
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
        config, saved = artifacts.read_run_config(model_dir)
        settings["dataset"] = saved["dataset"]  # evaluate on what the model was trained for
        for key in ("tfds_name", "source_language", "target_language", "data_dir",
                    "validation_files", "test_files"):
            settings[key] = settings.get(key) or saved.get(key)
        return evaluate(settings, config, artifacts.load_tokenizer(model_dir), model_dir)

    tokenizer = get_tokenizer(settings, config, model_dir)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
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
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "tensorflow"):  # SavedModel tracing chatter
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from keras_transformer.config import ConfigError
    from keras_transformer.data.corpora import DataError
    from trainers.strategy import StrategyError

    try:
        run(argv)
    except (ConfigError, DataError, StrategyError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
