"""The learning-rate schedule and optimizer of §5.3."""

import logging

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (§5.3, eq. 3).

    Steps count from 1; a step below 1 (Keras's first optimizer iteration is 0) is read as 1.
    `scale` (default 1, the paper) multiplies the whole curve.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = tf.maximum(tf.cast(step, tf.float32), 1.0)
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
    """

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
    `FusedAdam`.

    `learning_rate` is a float (to be set by `ScheduleCallback`) or a schedule.
    """
    return FusedAdam(learning_rate=learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                     gradient_accumulation_steps=gradient_accumulation_steps, **kwargs)


class ScheduleCallback(keras.callbacks.Callback):
    """Sets the optimizer's learning rate from `schedule` before every step, numbering the
    steps from 1 as the paper does, and adds it to the logs as `learning_rate` (the progress
    bar and TensorBoard show it). With gradient accumulation, a step is one weight update.
    """

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule
        self.rate = None

    def on_train_batch_begin(self, batch, logs=None):
        # Keras's `iterations` counts weight updates (accumulation included) from 0.
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) + 1
        self.rate = float(self.schedule(step))
        self.model.optimizer.learning_rate = self.rate

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self.rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.rate is not None:
            logs["learning_rate"] = self.rate
            logger.info("epoch %d: learning rate %.3g", epoch + 1, self.rate)
