"""Checkpoints every N steps or minutes (keeping the last K), resumption, and averaging (§6.1)."""

import logging
import pathlib
import time

import numpy as np

from keras_transformer.run_dir import (checkpoint_path, list_checkpoints, load_weights,
                                       save_model_weights)
from keras_transformer.schedule import HostStepCounter

logger = logging.getLogger(__name__)


class PeriodicCheckpoint(HostStepCounter):
    """Saves the weights every `every_steps` optimizer steps and every `every_minutes` minutes
    (the paper: 10), and at the end of training, keeping the newest `keep` files. Steps are
    counted on the host; with `steps_per_execution` a save falls on the first step at or
    after each multiple of `every_steps`."""

    def __init__(self, directory, every_steps=None, every_minutes=10.0, keep=20):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self._last_time = time.monotonic()

    def save(self):
        path = checkpoint_path(self.directory, self.step)
        self._last_time = time.monotonic()
        if path.exists():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".ckpt-*"):  # half-written by a killed run
            stale.unlink()
        save_model_weights(self.model, path)
        logger.info("saved %s", path)
        for old in list_checkpoints(self.directory)[:-self.keep]:
            old.unlink()

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        by_steps = self.crossed(self.every_steps)
        by_time = (self.every_minutes and
                   time.monotonic() - self._last_time >= 60 * self.every_minutes)
        if by_steps or by_time:
            self.save()

    def on_train_end(self, logs=None):
        if self._micro_batches is not None:  # at least one batch ran
            self.save()


def average_checkpoints(model, paths):
    """Loads each checkpoint into `model` and sets its weights to their element-wise mean
    (§6.1: the last 5 checkpoints for base models, 20 for big). Returns the mean weights."""
    if not paths:
        raise FileNotFoundError("No checkpoints to average.")
    total = None
    for index, path in enumerate(paths):
        logger.info("averaging: reading %s (%d of %d)", path.name, index + 1, len(paths))
        load_weights(model, path)
        weights = [np.asarray(w, np.float64) for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    mean = [(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.get_weights())]
    model.set_weights(mean)
    logger.info("averaged %d checkpoints: %s ... %s", len(paths), paths[0].name, paths[-1].name)
    return mean
