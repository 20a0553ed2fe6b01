"""The training batches, fed to Keras from one host-side iterator whose position is saved with
each backup, so a resumed run continues the input stream instead of replaying it."""

import logging
import tempfile
import time

import tensorflow as tf

logger = logging.getLogger(__name__)


class ResumableInput:
    """`dataset` (for `model.fit`) yields the batches of `batches` one by one from a plain
    tf.data iterator over the numbered batches, which `save` and `restore` checkpoint.

    tf.distribute's own iterators cannot be checkpointed (tensorflow#56372), hence the plain
    iterator. Keras' distributed iterator reads a few batches ahead of the train step, so a
    state saved at step s may lie past batch s: `restore` peeks at the number of the batch a
    saved state comes to next and skips from there to the batch wanted, trying the states it
    is given in turn and falling back to a replay from the start.
    """

    def __init__(self, batches):
        iterator = iter(batches.enumerate())
        self._iterator = iterator
        self.dataset = tf.data.Dataset.from_tensors(0).repeat().map(
            lambda _: iterator.get_next()[1])

    def _checkpoint(self):
        return tf.train.Checkpoint(input=self._iterator)

    def save(self, prefix):
        """Writes the iterator's state (its shuffle buffers included) to `prefix`.*."""
        self._checkpoint().write(str(prefix))

    def restore(self, prefixes, batch):
        """Positions the stream so that its next batch is number `batch` (0-based), from the
        first state in `prefixes` that is not past it, else from the start. Returns the
        number of batches read and dropped to get there."""
        with tempfile.TemporaryDirectory() as scratch:
            start = f"{scratch}/start"
            self.save(start)  # nothing read yet: batch 0 comes next
            for prefix in [*prefixes, start]:
                self._checkpoint().read(str(prefix)).assert_consumed()
                first = int(next(self._iterator)[0])
                if first > batch:
                    logger.info("input state %s is past batch %d (at %d): trying an older one",
                                prefix, batch, first)
                    continue
                self._checkpoint().read(str(prefix)).assert_consumed()
                return self._skip(batch - first)
        raise AssertionError("unreachable: the start is never past a batch")

    def _skip(self, count):
        start = time.monotonic()
        for done in range(count):
            next(self._iterator)
            if time.monotonic() - start > 5 and done % 100 == 0:
                logger.info("input position: skipped %d of %d batches", done, count)
        return count
