"""Adam through TensorFlow's fused kernel (speed work; see kernels/__init__.py)."""

import keras
import tensorflow as tf


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
