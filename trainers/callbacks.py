"""Progress reporting (target tokens per second, the real-token share of the batch budget)
and the training time budget. None of them reads the device more than twice an epoch."""

import json
import logging
import os
import pathlib
import time

import keras
import tensorflow as tf

from keras_transformer.masks import padding_mask
from keras_transformer.run_dir import write_text_atomically

logger = logging.getLogger(__name__)


def usable_cores():
    """The cores this process may run on (its affinity, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class TargetTokens(keras.metrics.Metric):
    """Real (non-padding) target tokens seen this epoch, summed over replicas."""

    def __init__(self, pad_id=0, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(tf.reduce_sum(tf.cast(padding_mask(y_true, self.pad_id),
                                                    tf.float32)))

    def result(self):
        # A copy: the variable itself would show validation's count in the training logs
        # once the epoch-end validation resets and refills it.
        return tf.identity(self.total)

    def reset_state(self):
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


class Throughput(keras.callbacks.Callback):
    """At each epoch end, adds to the logs `tokens_per_second` (real target tokens, all
    replicas, per second of the epoch after its first batch, which holds tracing and warm-up;
    the validation loss and any time given to `exclude` left out)
    and `real_token_share` (real target tokens over batches x `batch_tokens`), and logs both.
    Over the same time it counts this process's CPU seconds (all its threads), so that the
    summary says how much of the machine training used (`cpu_use`, of all usable cores).
    Reads the token count twice an epoch: after the first batch and at the end."""

    def __init__(self, batch_tokens=None):
        super().__init__()
        self.batch_tokens = batch_tokens
        self.history = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._tokens_at_start, self._batches = None, 0.0, 0
        self._paused = self._paused_cpu = 0.0

    def exclude(self, seconds, cpu_seconds=0.0):
        """Leaves `seconds` of this epoch (and `cpu_seconds` of this process's CPU time),
        spent on something else, out of its figures."""
        if self._start is not None:
            self._paused += seconds
            self._paused_cpu += cpu_seconds

    def on_test_begin(self, logs=None):  # the validation loss, within fit
        self._test_start = (time.perf_counter(), time.process_time())

    def on_test_end(self, logs=None):
        wall, cpu = self._test_start
        self.exclude(time.perf_counter() - wall, time.process_time() - cpu)

    def on_train_batch_end(self, batch, logs=None):
        self._batches = batch + 1
        if self._start is None and logs is not None and "target_tokens" in logs:
            self._tokens_at_start = float(logs["target_tokens"])
            self._start, self._first_batches = time.perf_counter(), batch + 1
            self._cpu_start = time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or "target_tokens" not in logs or self._start is None:
            return
        tokens = float(logs["target_tokens"])
        elapsed = time.perf_counter() - self._start - self._paused
        cpu = time.process_time() - self._cpu_start - self._paused_cpu
        figures = {}
        if self._batches > self._first_batches:
            figures["tokens_per_second"] = (tokens - self._tokens_at_start) / max(elapsed, 1e-9)
        if self.batch_tokens:
            figures["real_token_share"] = tokens / (self._batches * self.batch_tokens)
        logs.update(figures)
        self.history.append({"epoch": epoch + 1, "batches": self._batches,
                             "target_tokens": tokens, "timed_tokens": tokens - self._tokens_at_start,
                             "timed_seconds": elapsed, "cpu_seconds": cpu,
                             "loss": float(logs.get("loss", "nan")),
                             **figures})
        logger.info("epoch %d: %s", epoch + 1,
                    ", ".join(f"{k.replace('_', ' ')} {v:,.3g}" for k, v in figures.items()))

    def summary(self):
        """The run's figures: totals over its epochs and the last epoch's loss."""
        if not self.history:
            return {}
        batches = sum(e["batches"] for e in self.history)
        tokens = sum(e["target_tokens"] for e in self.history)
        seconds = sum(e["timed_seconds"] for e in self.history)
        cpu = sum(e["cpu_seconds"] for e in self.history)
        return {"batches": batches, "target_tokens": tokens,
                "tokens_per_second": sum(e["timed_tokens"] for e in self.history) / max(seconds, 1e-9),
                "cpu_use": cpu / max(seconds * usable_cores(), 1e-9),
                "real_token_share": tokens / (batches * self.batch_tokens) if self.batch_tokens else None,
                "final_loss": self.history[-1]["loss"], "epochs": self.history}


class TimeBudget(keras.callbacks.Callback):
    """Stops training once `minutes` of training have passed, counting the minutes of earlier
    runs in the same model_dir (kept in `record`), so a resumed run continues the budget.
    Checked on the host after every batch; the stop comes at the end of a step."""

    def __init__(self, minutes, record):
        super().__init__()
        self.minutes, self.record = minutes, pathlib.Path(record)
        self.stopped = False  # whether it stopped this run's training

    def used_before(self):
        if self.record.exists():
            return float(json.loads(self.record.read_text())["train_minutes"])
        return 0.0

    def used(self):
        return self._before + (time.monotonic() - self._start) / 60

    def exhausted(self):
        return self.used_before() >= self.minutes

    def on_train_begin(self, logs=None):
        self._before, self._start = self.used_before(), time.monotonic()

    def _write(self):
        self.record.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self.record, json.dumps({"train_minutes": self.used()}))

    def on_train_batch_end(self, batch, logs=None):
        if self.used() >= self.minutes and not self.model.stop_training:
            self.model.stop_training = self.stopped = True
            logger.info("time budget of %g minutes reached: stopping training", self.minutes)

    def on_epoch_end(self, epoch, logs=None):
        self._write()

    def on_train_end(self, logs=None):
        self._write()
