"""The optimizer of §5.3: Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9."""

from keras_transformer.kernels.fused_adam import FusedAdam


def make_optimizer(learning_rate, gradient_accumulation_steps=None, **kwargs):
    """Adam with the paper's settings: beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 (§5.3), as
    `FusedAdam`; keyword arguments override them or add other Keras optimizer settings.

    `learning_rate` is a schedule (a `TransformerSchedule`, evaluated inside the train step)
    or a float.
    """
    settings = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    return FusedAdam(learning_rate=learning_rate,
                     gradient_accumulation_steps=gradient_accumulation_steps, **settings)
