"""Training a run: the model compiled for the strategy, the resumable input, the callbacks
(schedule, checkpoints, backups, validation, BLEU, best/, TensorBoard) and `model.fit`."""

import json
import time

import keras
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import run_dir
from keras_transformer.data import corpora, pipeline
from keras_transformer.translator import Translator
from trainers import run_data
from trainers.backup import TrainingBackup, common_backup_epoch, restore_backup
from trainers.callbacks import TargetTokens, Throughput, TimeBudget, usable_cores
from trainers.checkpoints import PeriodicCheckpoint
from trainers.scoring import score
from trainers.resumable_input import ResumableInput
from trainers.strategy import is_chief, worker_id
from trainers.validation import BestCheckpoint, ValidationLoss, ValidationTranslation


def checkpoint_dir(model_dir, chief, worker):
    """The chief's checkpoints are the run's; other workers keep theirs apart."""
    return model_dir / "checkpoints" if chief else model_dir / "workers" / worker / "checkpoints"


def validation_translation(settings, tokenizer, model_dir, copy):
    """The callback that translates the first --eval_sentences validation sentences every
    --eval_every_steps (with `copy`, a `WeightsCopy`) and scores them; None when that is off or
    there is no validation split."""
    if not settings.eval_every_steps or not settings.eval_sentences:
        return None
    try:
        pairs = run_data.split_pairs(settings, "validation").take(settings.eval_sentences)
        pairs = list(pairs.as_numpy_iterator())
    except corpora.DataError as error:
        print(f"No BLEU during training: {error}", flush=True)
        return None

    def make_translator(weights):  # Translators of the copy share its traced searches
        return Translator(copy(weights), tokenizer, beam_size=settings.eval_beam_size,
                          alpha=settings.alpha, max_extra=settings.max_extra,
                          batch_size=settings.eval_batch_size)

    return ValidationTranslation(
        settings.eval_every_steps, [s.decode("utf-8") for s, _ in pairs],
        [t.decode("utf-8") for _, t in pairs], make_translator,
        lambda hypotheses, references: score(hypotheses, references), model_dir / "eval",
        model_dir / "logs" / "eval")


def best_checkpoint(settings, model_dir, copy, bleu_evaluated, validated):
    """best/ by --best_metric (loss when BLEU is not evaluated), exported with `copy` (a
    `WeightsCopy`) under --export_on_best; None without validation."""
    metric = settings.best_metric if bleu_evaluated else "loss"
    if metric == "loss" and not validated:
        return None
    if not settings.export_on_best:
        return BestCheckpoint(model_dir / "best", metric)
    from export.saved_model import export

    def export_best(weights, folder):
        return export(copy(weights), model_dir / "vocab.model", folder,
                      beam_size=settings.beam_size, alpha=settings.alpha,
                      max_extra=settings.max_extra)
    return BestCheckpoint(model_dir / "best", metric, export_best)


def evaluation_callbacks(settings, config, tokenizer, model_dir, validated, throughput, copy):
    """The chief's: TensorBoard, BLEU every --eval_every_steps (translated by `copy`, a
    `WeightsCopy`), the validation loss at the global step, and best/."""
    # update_freq="epoch": with a step count, Keras 3.15 records no epoch summaries (no
    # validation loss, no learning rate) unless the epoch ends on a multiple of it.
    callbacks = [keras.callbacks.TensorBoard(str(model_dir / "logs"), update_freq="epoch")]
    translation = validation_translation(settings, tokenizer, model_dir, copy)
    best = best_checkpoint(settings, model_dir, copy, translation is not None, validated)
    if translation is not None:
        translation.best, translation.on_pause = best, throughput.exclude
        callbacks.append(translation)
    if validated:
        callbacks.append(ValidationLoss(model_dir / "logs" / "eval", best))
    return callbacks


def make_callbacks(settings, config, tokenizer, schedule, model_dir, strategy,
                   resumable_input, validated, copy, budget=None):
    """Every callback of the run, in the order Keras calls them (`copy`: the `WeightsCopy`
    that translates)."""
    chief, worker = is_chief(strategy), worker_id(strategy)
    throughput = Throughput(settings.batch_tokens)
    callbacks = [
        kt.ScheduleCallback(schedule),
        throughput,
        keras.callbacks.TerminateOnNaN(),
        PeriodicCheckpoint(checkpoint_dir(model_dir, chief, worker),
                           settings.checkpoint_every_steps, settings.checkpoint_every_minutes,
                           settings.keep_checkpoints),
        TrainingBackup(model_dir / "backup" / worker, resumable_input,
                       settings.batches_between_backups()),
    ]
    if budget is not None:
        callbacks.append(budget)
    if chief:
        callbacks += evaluation_callbacks(settings, config, tokenizer, model_dir, validated,
                                          throughput, copy)
    return callbacks


def compiled_model(settings, config, schedule, strategy, steps_per_execution=1):
    """The Transformer, its optimizer (§5.3), loss (§5.4) and metrics, built in `strategy`,
    running `steps_per_execution` train steps per call (the benchmarks time one a call)."""
    accumulation = settings.grad_accum if settings.grad_accum > 1 else None
    in_training = settings.train_metrics  # else validation only: they cost a pass over the logits
    with strategy.scope():
        model = kt.Transformer(config)
        model.build()
        model.compile(optimizer=kt.make_optimizer(schedule,
                                                  gradient_accumulation_steps=accumulation),
                      loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
                      metrics=[kt.MaskedTokenAccuracy(config.pad_id, in_training=in_training),
                               kt.Perplexity(config.pad_id, in_training=in_training),
                               TargetTokens(config.pad_id)],
                      jit_compile=settings.jit_compile,
                      steps_per_execution=steps_per_execution)
    return model


def report(settings, model, throughput, seconds, model_dir, chief):
    """Writes train_summary.json (chief) and prints the run's throughput."""
    summary = {**throughput.summary(), "fit_seconds": seconds,
               "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
               "precision": settings.precision_chosen, "batch_tokens": settings.batch_tokens}
    if chief:
        run_dir.write_text_atomically(model_dir / "train_summary.json",
                                      json.dumps(summary, indent=2))
    if summary.get("real_token_share") is not None:
        print(f"trained to step {summary['steps']}: {summary['tokens_per_second']:,.0f} real "
              f"target tokens/s, {100 * summary['real_token_share']:.1f}% of the batch budget "
              f"real target tokens, CPU use {100 * summary['cpu_use']:.0f}% of "
              f"{usable_cores()} cores", flush=True)


def train(settings, config, strategy, tokenizer, model_dir, copy):
    """Trains (or resumes) the run in `model_dir` to --train_steps or --train_minutes. `copy`
    (a `WeightsCopy`) translates for the BLEU during training and exports best/; the final
    evaluation can reuse it, its searches traced."""
    worker = worker_id(strategy)
    schedule = kt.TransformerSchedule(config.d_model, config.warmup_steps, settings.lr_scale)
    model = compiled_model(settings, config, schedule, strategy,
                           settings.steps_per_execution_chosen)
    static = settings.static_batches or isinstance(strategy, tf.distribute.TPUStrategy)
    replicas = strategy.num_replicas_in_sync
    stats = pipeline.PipelineStats()
    resumable_input = ResumableInput(run_data.training_batches(settings, config, tokenizer,
                                                             replicas, static, stats))
    # A Keras epoch is one backup interval; validation comes every --validate_every_steps.
    interval = settings.backup_every_steps
    epochs, done = config.train_steps // interval, 0
    backups = model_dir / "backup" / worker
    restored = restore_backup(backups, model, resumable_input,
                              common_backup_epoch(backups, strategy))
    if restored:
        done = restored["epoch"]
        print(f"Resumed at step {restored['step']}: weights, optimizer and input position "
              f"restored in {restored['seconds']:.1f} s ({restored['skipped']} batches read "
              "again to reach the position)", flush=True)
    budget = None
    if settings.train_minutes is not None:
        budget = TimeBudget(settings.train_minutes, model_dir / "backup" / worker / "time.json")
        if budget.exhausted():
            print(f"The time budget of {settings.train_minutes:g} minutes is used up: "
                  "no more training.", flush=True)
            done = epochs
    if done < epochs:
        validation = run_data.validation_batches(settings, config, tokenizer, replicas, static)
        if validation is not None:
            validation = run_data.distributed(validation, strategy)
        callbacks = make_callbacks(settings, config, tokenizer, schedule, model_dir, strategy,
                                   resumable_input, validation is not None, copy, budget)
        start = time.monotonic()
        model.fit(run_data.distributed(resumable_input.dataset, strategy),
                  epochs=epochs, initial_epoch=done,
                  steps_per_epoch=settings.batches_between_backups(), callbacks=callbacks,
                  verbose=settings.verbose, shuffle=False, validation_data=validation,
                  validation_freq=settings.validate_every_steps // interval)
        validation_loss = next((c for c in callbacks if isinstance(c, ValidationLoss)), None)
        if budget is not None and budget.stopped and validation_loss is not None:
            validation_loss.validate_the_last_step(validation)
        throughput = next(c for c in callbacks if isinstance(c, Throughput))
        report(settings, model, throughput, time.monotonic() - start, model_dir,
               is_chief(strategy))
    elif is_chief(strategy) and not (model_dir / "train_summary.json").exists():
        # Killed after its last backup, before the summary: the steps are the backup's.
        run_dir.write_text_atomically(model_dir / "train_summary.json", json.dumps({
            "steps": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            "precision": settings.precision_chosen, "batch_tokens": settings.batch_tokens,
            "note": "restored from the last backup; the throughput of the run was not kept"},
            indent=2))
    stats.log()
    run_data.log_skipped()
