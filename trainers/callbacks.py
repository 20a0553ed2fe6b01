"""Progress reporting: target tokens per second in the progress bar and TensorBoard."""

import time

import keras
import tensorflow as tf


class TargetTokens(keras.metrics.Metric):
    """Real (non-padding) target tokens seen this epoch, summed over replicas."""

    def __init__(self, pad_id=0, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(tf.reduce_sum(tf.cast(tf.not_equal(y_true, self.pad_id),
                                                    tf.float32)))

    def result(self):
        return self.total

    def reset_state(self):
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


class Throughput(keras.callbacks.Callback):
    """Adds `tokens_per_second` (real target tokens, all replicas) to the logs, averaged over
    the epoch so far; the first batch of an epoch (tracing, warm-up) is left out."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._tokens_at_start = None, 0.0

    def on_train_batch_end(self, batch, logs=None):
        if logs is None or "target_tokens" not in logs:
            return
        tokens = float(logs["target_tokens"])
        if self._start is None:
            self._start, self._tokens_at_start = time.perf_counter(), tokens
            return
        elapsed = time.perf_counter() - self._start
        logs["tokens_per_second"] = (tokens - self._tokens_at_start) / max(elapsed, 1e-9)
        self._last = logs["tokens_per_second"]

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and getattr(self, "_last", None) is not None:
            logs["tokens_per_second"] = self._last
