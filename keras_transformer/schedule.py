"""The learning-rate schedule of §5.3, and the callback that trains with it."""

import logging

import keras
from keras import ops

from keras_transformer.optimizer import unwrapped

logger = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (§5.3, eq. 3).

    Called, as Keras optimizers call schedules, with the optimizer's iteration count, which
    starts at 0: `schedule(i)` is the paper's rate at step i + 1, so the first update uses
    step 1's rate and no two updates share one. Give it to the optimizer
    (`make_optimizer(schedule)`): the rate is then computed inside the train step.
    `scale` (default 1, the paper) multiplies the whole curve.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        rate = ops.minimum(step**-0.5, step * float(self.warmup_steps) ** -1.5)
        return self.scale * float(self.d_model) ** -0.5 * rate

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


class HostStepCounter(keras.callbacks.Callback):
    """Counts weight updates on the host, so callbacks need no device read per step: reads
    the optimizer's iteration count once, before the first batch (after a resumed run has
    restored it), then adds the batches Keras reports (several per call with
    `steps_per_execution`). `self.step` is the number of updates done (micro-batches
    divided by the gradient accumulation steps)."""

    def on_train_begin(self, logs=None):
        self._micro_batches = None

    def on_epoch_begin(self, epoch, logs=None):
        self._seen_in_epoch = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self._micro_batches is None:
            optimizer = unwrapped(self.model.optimizer)
            self._accumulation = optimizer.gradient_accumulation_steps or 1
            self._micro_batches = int(keras.ops.convert_to_numpy(optimizer._iterations))

    def on_train_batch_end(self, batch, logs=None):
        self._step_before = self.step
        self._micro_batches += batch + 1 - self._seen_in_epoch
        self._seen_in_epoch = batch + 1

    @property
    def step(self):
        """Weight updates done so far (micro-batches over the gradient accumulation steps)."""
        return (self._micro_batches or 0) // getattr(self, "_accumulation", 1)

    def crossed(self, every):
        """Whether the last batch took the step past a multiple of `every` (never if 0/None)."""
        return bool(every) and self.step // every > self._step_before // every


class ScheduleCallback(HostStepCounter):
    """Trains with `schedule` (e.g. a `TransformerSchedule`): hands it to the optimizer when
    training begins, if the optimizer does not have it already, so the rate is computed inside
    the train step at the optimizer's own step count. Adds the rate of the last update to the
    logs as `learning_rate` (the progress bar and TensorBoard show it) from a step count kept
    on the host: no device read per step. With gradient accumulation a step is one update.
    """

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule
        self.rate = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        optimizer = unwrapped(self.model.optimizer)
        if optimizer._learning_rate is not self.schedule:
            optimizer.learning_rate = self.schedule
            self.model.make_train_function(force=True)  # a traced step read the old rate

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        with keras.device("cpu:0"):  # a host computation: no wait on an accelerator's queue
            self.rate = float(keras.ops.convert_to_numpy(self.schedule(self.step - 1)))
        if logs is not None:
            logs["learning_rate"] = self.rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.rate is not None:
            logs["learning_rate"] = self.rate
            logger.info("epoch %d: learning rate %.3g", epoch + 1, self.rate)
