"""Evaluation during training: the validation loss and perplexity at the global step, BLEU
and chrF of greedy (or beam) translations every N steps, and the best step kept in best/."""

import json
import logging
import pathlib
import shutil
import time

import tensorflow as tf

from keras_transformer.run_dir import build_model, save_model_weights, write_text_atomically
from keras_transformer.schedule import HostStepCounter

logger = logging.getLogger(__name__)


class WeightsCopy:
    """A model of `config`, built on first use outside any distribution strategy, that
    takes the weights of a training model: calling it with `model.get_weights()` returns it
    with those weights (decoding and export trace the copy, not the training model)."""

    def __init__(self, config):
        self.config, self.model = config, None

    def __call__(self, weights):
        self.model = self.model or build_model(self.config)
        self.model.set_weights(weights)
        return self.model


class BestCheckpoint:
    """`directory` (model_dir/best) holds the weights of the best step so far by one
    validation metric (higher BLEU, or lower loss): ckpt-<step>.weights.h5 and best.json
    ({"metric", "value", "step"}); with `export` (a function of the weights and a folder) the
    model is exported to best/export each time it improves. Survives a resume."""

    def __init__(self, directory, metric, export=None):
        self.directory, self.metric, self.export = pathlib.Path(directory), metric, export
        record = self.directory / "best.json"
        self.best = json.loads(record.read_text()) if record.exists() else None

    def improves(self, value):
        if self.best is None:
            return True
        return value > self.best["value"] if self.metric == "bleu" else value < self.best["value"]

    def offer(self, step, value, model):
        """Keeps `model`'s weights if `value` (of this metric, at `step`) beats the best."""
        if not self.improves(value):
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        # new weights, then the record naming them, then the old weights go: a kill at any
        # point leaves best.json naming a whole file
        kept = save_model_weights(model, self.directory / f"ckpt-{step:08d}.weights.h5")
        self.best = {"metric": self.metric, "value": value, "step": step}
        write_text_atomically(self.directory / "best.json", json.dumps(self.best))
        for old in self.directory.glob("ckpt-*.weights.h5"):
            if old != kept:
                old.unlink()
        logger.info("best/ now holds step %d (validation %s %.4g)", step, self.metric, value)
        if self.export is not None:
            shutil.rmtree(self.directory / "export", ignore_errors=True)
            target = self.export(model.get_weights(), self.directory / "export")
            logger.info("exported best/ for TF Serving: %s", target)
        return True


class ValidationLoss(HostStepCounter):
    """Writes Keras' validation loss and perplexity (val_loss, val_perplexity) to TensorBoard
    as validation/loss and validation/perplexity at the global step, and offers the step to
    `best` when it keeps the best by loss. The step is the host's count of updates, not the
    epoch's nominal end: a time budget that stops an epoch early validates the step reached."""

    def __init__(self, log_dir, best=None):
        super().__init__()
        self.log_dir, self.best = log_dir, best
        self._writer = None
        self.validated_step = None

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_loss" in logs:
            self.write(logs["val_loss"], logs.get("val_perplexity"))

    def validate_the_last_step(self, validation):
        """After a time budget stopped training: Keras validates an epoch cut short only when
        validation_freq says so, so the step reached is validated here if it was not."""
        if self.validated_step != self.step:
            logs = self.model.evaluate(validation, verbose=0, return_dict=True)
            self.write(logs["loss"], logs.get("perplexity"))

    def write(self, loss, perplexity=None):
        step = self.step
        self._writer = self._writer or tf.summary.create_file_writer(str(self.log_dir))
        with self._writer.as_default(step=step):
            tf.summary.scalar("validation/loss", loss)
            if perplexity is not None:
                tf.summary.scalar("validation/perplexity", perplexity)
        self._writer.flush()
        self.validated_step = step
        if self.best is not None and self.best.metric == "loss":
            self.best.offer(step, float(loss), self.model)


class ValidationTranslation(HostStepCounter):
    """Every `every_steps` steps, translates `sources` with a copy of the model (built by
    `make_translator(weights)`), scores them against `references` with sacreBLEU and chrF,
    logs the scores and the decode time, writes validation/bleu, validation/chrf and
    validation/decode_seconds to TensorBoard at the step, and saves the translations as
    `out_dir`/step-<step>.txt. Training waits for it: the pause is the decode time (logged)."""

    def __init__(self, every_steps, sources, references, make_translator, score, out_dir,
                 log_dir, best=None, on_pause=None):
        super().__init__()
        self.on_pause = on_pause  # told the seconds training waited, and their CPU seconds
        self.every_steps, self.sources, self.references = every_steps, sources, references
        self.make_translator, self.score = make_translator, score
        self.out_dir, self.log_dir, self.best = pathlib.Path(out_dir), log_dir, best
        self._writer = None
        self.history = []

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.crossed(self.every_steps):
            start, cpu = time.perf_counter(), time.process_time()
            self.evaluate(self.step)
            if self.on_pause is not None:
                self.on_pause(time.perf_counter() - start, time.process_time() - cpu)

    def evaluate(self, step):
        start = time.perf_counter()
        translator = self.make_translator(self.model.get_weights())
        hypotheses = translator.translate(self.sources)
        seconds = time.perf_counter() - start
        scores = self.score(hypotheses, self.references)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"step-{step:08d}.txt").write_text(
            "".join(h + "\n" for h in hypotheses), encoding="utf-8")
        self._writer = self._writer or tf.summary.create_file_writer(str(self.log_dir))
        with self._writer.as_default(step=step):
            tf.summary.scalar("validation/bleu", scores["bleu"])
            tf.summary.scalar("validation/chrf", scores["chrf"])
            tf.summary.scalar("validation/decode_seconds", seconds)
        self._writer.flush()
        record = {"step": step, "bleu": scores["bleu"], "chrf": scores["chrf"],
                  "sentences": len(hypotheses), "decode_seconds": seconds}
        self.history.append(record)
        with open(self.out_dir / "scores.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        logger.info("step %d: validation BLEU %.2f, chrF %.2f on %d sentences (decoded in "
                    "%.1f s, %.1f sentences/s)", step, scores["bleu"], scores["chrf"],
                    len(hypotheses), seconds, len(hypotheses) / max(seconds, 1e-9))
        if self.best is not None and self.best.metric == "bleu":
            self.best.offer(step, scores["bleu"], translator.model)
