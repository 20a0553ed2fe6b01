"""Backups of the training state, for a run that is killed and started again: the weights
with the optimizer's state, and the input position (see resumable_input.py)."""

import json
import logging
import pathlib
import re
import shutil
import time

from keras_transformer.config import ConfigError
from keras_transformer.run_dir import load_weights
from keras_transformer.schedule import HostStepCounter

logger = logging.getLogger(__name__)

# The input state is saved this many batches before each backup: Keras reads a few batches
# ahead, and a state taken at the backup itself would lie past the batch a resume needs.
INPUT_LEAD = 8


def completed_backups(directory):
    """The complete backup folders in `directory` (epoch-000123; one being written or removed
    has a suffix), oldest first."""
    return sorted(p for p in pathlib.Path(directory).glob("epoch-*")
                  if p.is_dir() and re.fullmatch(r"epoch-\d+", p.name))


def backup_epoch(path):
    """The epoch a backup folder (epoch-000123) holds."""
    return int(path.name.split("-")[1])


def readable_backups(directory):
    """The complete backups in `directory` whose files open, oldest first. Backups are
    renamed into place only when whole, so a kill cannot cut one short; a full disk or a copy
    can, and such a backup is passed over, with a log line, for the one before it."""
    import h5py

    readable = []
    for path in completed_backups(directory):
        try:
            json.loads((path / "metadata.json").read_text())
            with h5py.File(path / "state.weights.h5", "r"):
                pass
        except (OSError, ValueError) as error:
            logger.warning("backup %s is unreadable (%s): resuming from the one before it",
                           path, str(error)[:200])
            continue
        readable.append(path)
    return readable


def backup_metadata(directory):
    """The newest complete backup's metadata ({"epoch", "batches", "step"}), or None."""
    found = completed_backups(directory)
    return json.loads((found[-1] / "metadata.json").read_text()) if found else None


class TrainingBackup(HostStepCounter):
    """Backs up the training state at the end of every Keras epoch (every
    --backup_every_steps): the weights with the optimizer (one .weights.h5), the input
    position, the epoch and the batches read. Each backup is written to a fresh folder and then
    renamed, so a kill while saving leaves the previous one whole; the newest two are kept.
    A Keras epoch cut short (the time budget) is not backed up: a resume starts from the last
    whole one."""

    def __init__(self, directory, resumable_input, batches_per_epoch):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.input = resumable_input
        self.batches_per_epoch = batches_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._input_saved = False
        self.directory.mkdir(parents=True, exist_ok=True)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if not self._input_saved and batch + 1 >= self.batches_per_epoch - INPUT_LEAD:
            self.input.save(self.directory / "pending" / "input")
            self._input_saved = True

    def on_epoch_end(self, epoch, logs=None):
        if self._seen_in_epoch < self.batches_per_epoch:
            return
        start = time.monotonic()
        target = self.directory / f"epoch-{epoch + 1:06d}"
        partial = target.with_name(target.name + ".partial")
        for stale in self.directory.glob("epoch-*.*"):  # .partial, .discarded: left by a kill
            shutil.rmtree(stale)
        (self.directory / "pending").rename(partial)
        self.model.save_weights(partial / "state.weights.h5")
        (partial / "metadata.json").write_text(json.dumps(
            {"epoch": epoch + 1, "batches": self._micro_batches, "step": self.step}))
        # A backup of this epoch can exist already: one that the other workers lacked, left
        # aside when the run resumed from an older one (common_backup_epoch). This one replaces it.
        discard(target)
        partial.rename(target)
        for old in completed_backups(self.directory)[:-2]:
            discard(old)
        logger.info("backed up step %d in %.1f s", self.step, time.monotonic() - start)


def discard(backup):
    """Removes a backup folder, first renaming it out of `completed_backups`' sight: a kill
    in the middle of the removal leaves a .discarded folder, not a backup missing files."""
    if backup.exists():
        doomed = backup.with_name(backup.name + ".discarded")
        shutil.rmtree(doomed, ignore_errors=True)
        backup.rename(doomed)
        shutil.rmtree(doomed)


def common_backup_epoch(directory, strategy):
    """The epoch of the newest backup in `directory` that every worker of `strategy` has too
    (0: none). A kill between two workers' renames leaves one a backup newer than the
    other's; each restoring its own newest would put them at different steps (a hang or a
    divergence). Workers keep their two newest, so the smallest of the workers' newest is
    present on all of them."""
    import tensorflow as tf

    found = readable_backups(directory)
    newest = backup_epoch(found[-1]) if found else 0
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return newest
    everyone = strategy.gather(strategy.run(lambda: tf.constant([newest])), axis=0)
    return int(tf.reduce_min(everyone))


def restore_backup(directory, model, resumable_input, epoch=None):
    """Loads the newest backup in `directory` (with `epoch`, the newest up to that epoch)
    into `model` (weights and optimizer) and positions `resumable_input` after the batches it
    had read. Returns its metadata (None when there is no backup: a fresh start)."""
    found = readable_backups(directory)
    if epoch is not None:
        newer = [p for p in found if backup_epoch(p) > epoch]
        if newer:
            logger.info("restoring epoch %d, which every worker has; %s left aside", epoch,
                        ", ".join(p.name for p in newer))
        found = [p for p in found if p not in newer]
        if not found and epoch:
            raise ConfigError(f"{directory} has no backup of epoch {epoch} or older, which the "
                              "other workers would resume from: restore the workers' backup "
                              "folders or start the run anew.")
    if not found:
        if (pathlib.Path(directory) / "training_metadata.json").exists():
            raise ConfigError(
                f"{directory} holds a backup written by an earlier keras-transformer "
                "(keras.callbacks.BackupAndRestore), which this version cannot resume: finish "
                "that run with the version that started it, or use a new --model_dir.")
        return None
    start = time.monotonic()
    metadata = json.loads((found[-1] / "metadata.json").read_text())
    # The optimizer's slots are variables: under MirroredStrategy (or any other) they must be
    # created in the scope the model was built in, or Keras raises "Need to be inside
    # `with strategy.scope()`".
    with model.distribute_strategy.scope():
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        load_weights(model, found[-1] / "state.weights.h5")
    skipped = resumable_input.restore([p / "input" for p in reversed(found)],
                                      metadata["batches"])
    metadata.update(skipped=skipped, seconds=time.monotonic() - start)
    return metadata
