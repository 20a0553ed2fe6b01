"""The label-smoothed cross-entropy of §5.4, and per-token metrics: accuracy and perplexity."""

import contextlib
import contextvars
import functools

import keras
from keras import ops

from keras_transformer.masks import padding_mask


def smoothed_cross_entropy(labels, logits, label_smoothing):
    """Per-token cross-entropy [...] of `logits` [..., V] against the smoothed target
    t = (1 - eps) * one_hot(labels) + eps / V (§5.4), computed in float32."""
    if keras.backend.backend() == "tensorflow":
        return _compiled_cross_entropy(labels, logits, label_smoothing)
    return smoothed_cross_entropy_formula(labels, logits, label_smoothing)


def _compiled_cross_entropy(labels, logits, label_smoothing):
    """`smoothed_cross_entropy` on TensorFlow: the loss and its gradient each compiled by XLA
    into one or two passes over [tokens, V] (TensorFlow's fused kernel takes several, one into
    a buffer it allocates and zeroes afresh at every call). XLA compiles once per shape, so
    the token count is padded (`compiled.padding_rows`).
    A float32 tensor cast up from bfloat16 or float16 (the model's logits under mixed
    precision) is read as the tensor it was cast from: the same numbers, with the cast and its
    gradient's cast inside the compiled passes."""
    import tensorflow as tf

    from keras_transformer.compiled import padding_rows

    source = getattr(logits, "op", None)  # graph tensors only
    if (source is not None and source.type == "Cast"
            and source.inputs[0].dtype in (tf.bfloat16, tf.float16)):
        logits = source.inputs[0]
    logits = tf.convert_to_tensor(logits)
    forward, backward = _cross_entropy_functions()
    shape = tf.shape(logits)
    flat = tf.reshape(logits, [-1, shape[-1]])
    flat_labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    tokens = tf.shape(flat)[0]
    padding = [[0, padding_rows(tokens)]]
    eps = tf.constant(label_smoothing, tf.float32)

    @tf.custom_gradient
    def cross_entropy(flat):
        padded = tf.pad(flat, padding + [[0, 0]])
        padded_labels = tf.pad(flat_labels, padding)
        losses, log_normalizer = forward(padded, padded_labels, eps)

        def gradient(upstream):
            return backward(padded, padded_labels, log_normalizer, tf.pad(upstream, padding),
                            eps)[:tokens]

        return losses[:tokens], gradient

    return tf.reshape(cross_entropy(flat), shape[:-1])


@functools.cache
def _cross_entropy_functions():
    """The XLA-compiled halves of `_compiled_cross_entropy`:
    forward(logits [N, V], labels [N], eps) -> (losses [N], log-sum-exp [N]), float32;
    backward(logits, labels, log-sum-exp, upstream [N], eps) -> (softmax - t) * upstream
    [N, V] in the logits' dtype."""
    import tensorflow as tf

    from keras_transformer.compiled import rounded, widened

    # No autograph: neither half has Python control flow to convert, and converting them
    # lengthened each process's first trace of the loss.
    @tf.function(jit_compile=True, autograph=False)
    def forward(logits, labels, eps):
        x = widened(logits)
        chosen = tf.gather(x, labels, axis=1, batch_dims=1)

        def log_sum_exp(shift):
            return tf.math.log(tf.reduce_sum(tf.exp(x - shift[:, None]), -1)) + shift

        # Shifted by each row's own label logit, the sum of exp holds a term of 1, so it
        # cannot underflow; it overflows only where a logit exceeds the label's by more than
        # about 88, and then every row is summed again shifted by its largest logit (the
        # usual form). Training's logits are far from that, and finding the largest took a
        # pass over [N, V] of its own (benchmarks/results/cross_entropy.md).
        log_normalizer = log_sum_exp(chosen)
        log_normalizer = tf.cond(tf.reduce_all(tf.math.is_finite(log_normalizer)),
                                 lambda: log_normalizer,
                                 lambda: log_sum_exp(tf.reduce_max(x, axis=-1)))
        vocab = tf.cast(tf.shape(x)[-1], tf.float32)
        # -sum_j t_j log softmax_j, as in `smoothed_cross_entropy_formula`.
        return (log_normalizer - eps / vocab * tf.reduce_sum(x, -1) - (1.0 - eps) * chosen,
                log_normalizer)

    @tf.function(jit_compile=True, autograph=False)
    def backward(logits, labels, log_normalizer, upstream, eps):
        x = widened(logits)
        vocab = tf.shape(x)[-1]
        off = eps / tf.cast(vocab, tf.float32)
        target = tf.one_hot(labels, vocab, on_value=1.0 - eps + off, off_value=off)
        softmax = tf.exp(x - log_normalizer[:, None])
        return rounded((softmax - target) * upstream[:, None], logits.dtype)

    return forward, backward


def smoothed_cross_entropy_formula(labels, logits, label_smoothing):
    """`smoothed_cross_entropy` on any backend, without building t: since t sums to 1,
    -sum_j t_j log softmax(logits)_j
        = logsumexp(logits) - eps / V * sum(logits) - (1 - eps) * logits[label]."""
    logits = ops.cast(logits, "float32")
    vocab = ops.shape(logits)[-1]
    chosen = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]
    return (ops.logsumexp(logits, axis=-1) - label_smoothing / vocab * ops.sum(logits, axis=-1)
            - (1.0 - label_smoothing) * chosen)


def global_sum(value):
    """Sum of `value` over all replicas when called inside a `tf.distribute` replica context
    (the value itself on other backends, and outside one)."""
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against (1 - eps) * one_hot(y) + eps / V (label smoothing, §5.4), on
    logits, ignoring padding.

    `call(y_true [B, T], y_pred [B, T, V])` returns per-token losses [B, T] (0 on padding).
    Calling the loss returns the mean over the real tokens of the *global* batch: each replica
    returns its sum divided by the token count summed over all replicas, so the replicas'
    contributions add up (as Keras and `tf.distribute` expect) to exactly the single-device
    loss, whatever the number of real tokens on each replica. `sample_weight`, if given,
    weights tokens ([B] or [B, T]).
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        losses = smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
        return ops.where(padding_mask(y_true, self.pad_id), losses, 0.0)

    def __call__(self, y_true, y_pred, sample_weight=None):
        with keras.name_scope(self.name):
            losses = self.call(y_true, y_pred)
            weights = ops.cast(padding_mask(y_true, self.pad_id), "float32")
            if sample_weight is not None:
                sample_weight = ops.cast(sample_weight, "float32")
                if len(sample_weight.shape) == 1:
                    sample_weight = sample_weight[:, None]
                weights = weights * sample_weight
            total = ops.sum(losses * weights)
            return ops.divide_no_nan(total, global_sum(ops.sum(weights)))

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id}


_IN_TRAINING_STEP = contextvars.ContextVar("keras_transformer_training_step", default=False)


@contextlib.contextmanager
def training_step():
    """Marks what runs inside (and is traced inside) as a training step, for the metrics made
    with `in_training=False` (`Transformer.train_step` enters it)."""
    token = _IN_TRAINING_STEP.set(True)
    try:
        yield
    finally:
        _IN_TRAINING_STEP.reset(token)


class RealTokenMean(keras.metrics.Metric):
    """The mean of a per-token value over the real (non-padding) target tokens of every batch
    seen, summed over replicas; subclasses give `token_values(y_true, y_pred)` [batch, length]
    and may transform the mean in `finish`.

    `in_training=False` makes it an evaluation metric: training steps (inside
    `training_step()`) leave it alone and `Transformer` leaves it out of their logs, so that
    `fit` does not pay a pass over the [tokens, vocabulary] logits for it at every step, while
    `evaluate` (and the validation during `fit`) reports it as usual.
    """

    def __init__(self, pad_id=0, name=None, in_training=True, **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.in_training = in_training
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if not self.in_training and _IN_TRAINING_STEP.get():
            return
        y_true = ops.cast(y_true, "int32")
        real = ops.cast(padding_mask(y_true, self.pad_id), "float32")
        self.total.assign_add(ops.sum(self.token_values(y_true, y_pred) * real))
        self.count.assign_add(ops.sum(real))

    def finish(self, mean):
        """The reported value of the token mean (the mean itself here)."""
        return mean

    def result(self):
        return self.finish(ops.divide_no_nan(self.total, self.count))

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id, "in_training": self.in_training}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedTokenAccuracy(RealTokenMean):
    """Share of real (non-padding) target tokens whose arg-max prediction is correct."""

    def __init__(self, pad_id=0, name="token_accuracy", **kwargs):
        super().__init__(pad_id=pad_id, name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        """1.0 where the arg-max of y_pred [B, T, V] is y_true [B, T], else 0.0: [B, T]."""
        return ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, -1), "int32"), y_true), "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(RealTokenMean):
    """exp of the mean negative log-likelihood of the real (non-padding) target tokens,
    without label smoothing: perplexity per target token, weighted by tokens like the loss.
    y_pred holds logits [batch, length, vocab]."""

    def __init__(self, pad_id=0, name="perplexity", **kwargs):
        super().__init__(pad_id=pad_id, name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        """The negative log-likelihood [B, T] of y_true [B, T] under logits y_pred [B, T, V]:
        log(sum(exp(logits))) - logits[y_true]. (A metric needs no gradient, which
        TensorFlow's sparse softmax cross-entropy computes and writes anyway, as a
        [B, T, V] tensor, at every training step.)"""
        logits = ops.cast(y_pred, "float32")
        chosen = ops.take_along_axis(logits, y_true[..., None], axis=-1)[..., 0]
        return ops.logsumexp(logits, axis=-1) - chosen

    def finish(self, mean):
        """exp(mean NLL)."""
        return ops.exp(mean)
