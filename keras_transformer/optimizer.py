"""The optimizer of §5.3: Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenWeightedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` (§5.3) whose gradient accumulation weighs every real token
    alike. With gradient accumulation a learning-rate schedule sees the number of weight
    updates (Keras 3.15 hands it the number of micro-batches), and an update is the gradient of
    the mean loss over the real tokens of all its micro-batches together: Keras averages the
    micro-batches' gradients, each already divided by its own token count, so a short
    micro-batch's tokens would weigh more than a long one's. `Transformer.train_step` hands
    this optimizer each micro-batch's real-token count (`micro_batch_tokens`); each
    micro-batch's gradient is multiplied by it as it is accumulated and the update divided by
    the update's total. (The weighting is applied to the float32 gradients, not to the loss:
    under mixed_float16 a loss multiplied by thousands of tokens would overflow the float16
    gradients.) Without accumulation it is `keras.optimizers.Adam`.
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

    def _backend_apply_gradients(self, grads, trainable_variables):
        if self._token_weighted():
            tokens = ops.cast(self.micro_batch_tokens, "float32")
            self._accumulated_tokens.assign_add(tokens)
            # the gradient of the micro-batch's summed token losses
            grads = [None if g is None else g * ops.cast(tokens, g.dtype) for g in grads]
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if self._token_weighted():
            # Keras divided the summed gradients by the number of micro-batches.
            scale = self.gradient_accumulation_steps / ops.maximum(
                self._accumulated_tokens.value, 1.0)
            grads = [g * ops.cast(scale, g.dtype) for g in grads]
            self._accumulated_tokens.assign(0.0)
        return super()._backend_update_step(grads, trainable_variables,
                                            self._step_size(learning_rate))

    def _step_size(self, learning_rate):
        """Adam's step size with its bias correction, lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        (Kingma & Ba, 2015, section 2): one number per update, computed here once. Keras
        computes it inside `update_step`, once per variable: a dozen graph nodes for each
        variable, which the first step traces and optimises."""
        t = ops.cast(self.iterations + 1, "float32")
        correction = ops.sqrt(1 - ops.power(self.beta_2, t)) / (1 - ops.power(self.beta_1, t))
        return ops.cast(learning_rate, "float32") * correction

    def _distributed_tf_update_step(self, distribution, grads_and_vars, step_size):
        """TensorFlow: each variable's update as one `ResourceApplyAdam` op (what TensorFlow's
        own Adam ran), the same arithmetic as `update_step` below: one node per variable where
        Keras writes about ten, each traced through Keras' op dispatch.
        The beta powers handed to the op are 0 because `step_size` already holds the bias
        correction (the op multiplies by sqrt(1 - 0) / (1 - 0)). `distribution.extended.update`
        hands `apply` each replica's copies of the variable and its moments."""
        import tensorflow as tf

        if self.amsgrad:
            return super()._distributed_tf_update_step(distribution, grads_and_vars, step_size)

        constants = [tf.constant(x, tf.float32)
                     for x in (0.0, self.beta_1, self.beta_2, self.epsilon)]

        def apply(variable, gradient, m, v, step_size):
            # The op takes every input in the variable's dtype (casts that do nothing in float32).
            zero, beta_1, beta_2, epsilon, lr = (tf.cast(x, variable.dtype)
                                                 for x in (*constants, step_size))
            return tf.raw_ops.ResourceApplyAdam(
                var=variable.handle, m=m.handle, v=v.handle, beta1_power=zero, beta2_power=zero,
                lr=lr, beta1=beta_1, beta2=beta_2, epsilon=epsilon,
                grad=tf.cast(tf.convert_to_tensor(gradient), variable.dtype))

        for gradient, variable in grads_and_vars:
            index = self._get_variable_index(variable)
            distribution.extended.update(
                variable, apply, group=False,
                args=(gradient, self._momentums[index].value, self._velocities[index].value,
                      step_size))

    def update_step(self, gradient, variable, step_size):
        """Keras' `Adam.update_step`, with the step size from `_step_size` (the backends other
        than TensorFlow, and amsgrad)."""
        gradient = ops.cast(gradient, variable.dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        if self.amsgrad:
            v_hat = self._velocity_hats[index]
            self.assign(v_hat, ops.maximum(v_hat, v))
            v = v_hat
        step = ops.multiply(m, ops.cast(step_size, variable.dtype))
        self.assign_sub(variable, ops.divide(step, ops.add(ops.sqrt(v), self.epsilon)))

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenWeightedLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling for `mixed_float16` (float16 gradients underflow without it),
    with one change: a step whose gradients overflow is skipped, as in Keras, but still counts
    as a step: the inner optimizer's iteration count advances, so steps stay equal to the
    batches consumed (what the host step count, the learning-rate schedule, checkpoint names and
    the resumed input position rely on). Under gradient accumulation an overflowing micro-batch
    adds nothing to the update (neither gradient nor tokens); if it is the update's last, the
    whole update is dropped. `Transformer.compile` wraps its optimizer in this one under
    `mixed_float16`.
    """

    def _stateful_handle_non_finite_grads(self):
        super()._stateful_handle_non_finite_grads()
        inner = self.inner_optimizer
        if inner.gradient_accumulation_steps:
            def drop_update():
                inner._backend_reset_gradient_accumulators()
                if hasattr(inner, "_accumulated_tokens"):
                    inner._accumulated_tokens.assign(0.0)

            last = (inner._iterations + 1) % inner.gradient_accumulation_steps == 0
            keras.ops.cond(last, drop_update, lambda: None)
        inner._iterations.assign_add(1)


def unwrapped(optimizer):
    """The optimizer that updates the weights: the inner one of a `LossScaleOptimizer`
    (whose own `gradient_accumulation_steps` is None and whose own step count stays 0)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def make_optimizer(learning_rate, gradient_accumulation_steps=None, **kwargs):
    """Adam with the paper's settings: beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 (§5.3), as
    `TokenWeightedAdam`; keyword arguments override them or add other Keras optimizer settings.

    `learning_rate` is a schedule (a `TransformerSchedule`, evaluated inside the train step)
    or a float.
    """
    settings = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    return TokenWeightedAdam(learning_rate=learning_rate,
                             gradient_accumulation_steps=gradient_accumulation_steps, **settings)
