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
        return super()._backend_update_step(grads, trainable_variables, learning_rate)

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
