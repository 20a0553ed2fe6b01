"""The learning-rate schedule and optimizer of §5.3."""

import logging

import keras
import tensorflow as tf

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
        step = tf.cast(step, tf.float32) + 1.0
        rate = tf.minimum(step**-0.5, step * float(self.warmup_steps) ** -1.5)
        return self.scale * float(self.d_model) ** -0.5 * rate

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, each variable updated by TensorFlow's fused Adam kernel
    (`ResourceApplyAdam`: one op instead of about twenty). The same update (§5.3):

        m <- m + (1 - beta1)(g - m);  v <- v + (1 - beta2)(g^2 - v)
        w <- w - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)

    Falls back to Keras' update for AMSGrad and for variables of other dtypes than float32.
    With gradient accumulation a learning-rate schedule sees the number of weight updates
    (Keras 3.15 hands it the number of micro-batches), and an update is the gradient of the
    mean loss over the real tokens of all its micro-batches together: Keras averages the
    micro-batches' gradients, each already divided by its own token count, so a short
    micro-batch's tokens would weigh more than a long one's. `Transformer.train_step` hands
    this optimizer each micro-batch's real-token count (`micro_batch_tokens`); the loss is
    scaled by it and the accumulated gradient divided by the update's total.
    """

    micro_batch_tokens = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.gradient_accumulation_steps:
            self._accumulated_tokens = self.add_variable(
                (), initializer="zeros", name="accumulated_tokens",
                aggregation="only_first_replica")

    def _token_weighted(self):
        return bool(self.gradient_accumulation_steps) and self.micro_batch_tokens is not None

    def scale_loss(self, loss):
        loss = super().scale_loss(loss)
        if not self._token_weighted():
            return loss
        tokens = tf.cast(self.micro_batch_tokens, loss.dtype)
        self._accumulated_tokens.assign_add(tf.cast(tokens, tf.float32))
        return loss * tokens  # the gradient of the micro-batch's summed token losses

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if self._token_weighted():
            # Keras divided the summed gradients by the number of micro-batches.
            scale = self.gradient_accumulation_steps / tf.maximum(
                self._accumulated_tokens.value, 1.0)
            grads = [g * tf.cast(scale, g.dtype) for g in grads]
            self._accumulated_tokens.assign(0.0)
        return super()._backend_update_step(grads, trainable_variables, learning_rate)

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or variable.dtype != tf.float32:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        step = tf.cast(self.iterations + 1, tf.float32)
        beta_1, beta_2 = tf.constant(self.beta_1, tf.float32), tf.constant(self.beta_2, tf.float32)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle, beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, tf.float32),
            beta1=beta_1, beta2=beta_2, epsilon=tf.constant(self.epsilon, tf.float32),
            grad=tf.cast(tf.convert_to_tensor(gradient), tf.float32))


def make_optimizer(learning_rate, gradient_accumulation_steps=None, **kwargs):
    """Adam with the paper's settings: beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 (§5.3), as
    `FusedAdam`; keyword arguments override them or add other Keras optimizer settings.

    `learning_rate` is a schedule (a `TransformerSchedule`, evaluated inside the train step)
    or a float.
    """
    settings = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    return FusedAdam(learning_rate=learning_rate,
                     gradient_accumulation_steps=gradient_accumulation_steps, **settings)


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
            optimizer = self.model.optimizer
            self._accumulation = optimizer.gradient_accumulation_steps or 1
            self._micro_batches = int(keras.ops.convert_to_numpy(optimizer._iterations))

    def on_train_batch_end(self, batch, logs=None):
        self._micro_batches += batch + 1 - self._seen_in_epoch
        self._seen_in_epoch = batch + 1

    @property
    def step(self):
        return (self._micro_batches or 0) // getattr(self, "_accumulation", 1)


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
        optimizer = self.model.optimizer
        if optimizer._learning_rate is not self.schedule:
            optimizer.learning_rate = self.schedule
            self.model.make_train_function(force=True)  # a traced step read the old rate

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        with tf.device("/cpu:0"):  # a host computation: no wait on an accelerator's queue
            self.rate = float(self.schedule(self.step - 1))
        if logs is not None:
            logs["learning_rate"] = self.rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.rate is not None:
            logs["learning_rate"] = self.rate
            logger.info("epoch %d: learning rate %.3g", epoch + 1, self.rate)
