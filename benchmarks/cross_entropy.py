"""The label-smoothed cross-entropy and its gradient on TensorFlow, both ways the library
computes it: TensorFlow's fused kernel (`losses.smoothed_cross_entropy` there) and the
backend-agnostic formula (`losses.smoothed_cross_entropy_formula`, what JAX and PyTorch run),
beside the loss and its gradient each compiled by XLA (`xla_cross_entropy`, a candidate that
the library does not use: see benchmarks/results/cross_entropy.md).

    python -m benchmarks.cross_entropy [--tokens 4000] [--vocab 8000] [--repeats 20]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from keras_transformer import losses


def step_ms(cross_entropy, labels, logits, repeats):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            z = tf.identity(logits)
            tape.watch(z)
            loss = tf.reduce_sum(cross_entropy(labels, z, 0.1))
        return loss, tape.gradient(loss, z)

    step()[1].numpy()
    began = time.perf_counter()
    for _ in range(repeats):
        step()[1].numpy()
    return (time.perf_counter() - began) / repeats * 1000


@tf.function(jit_compile=True)
def _xla_forward(logits, labels, eps):
    """logits [N, V], labels [N] -> (losses [N], log-sum-exp [N]), fused by XLA."""
    x = tf.cast(logits, tf.float32)
    largest = tf.reduce_max(x, axis=-1)
    log_normalizer = tf.math.log(tf.reduce_sum(tf.exp(x - largest[:, None]), -1)) + largest
    chosen = tf.gather(x, labels, axis=1, batch_dims=1)
    vocab = tf.cast(tf.shape(x)[-1], tf.float32)
    return (log_normalizer - eps / vocab * tf.reduce_sum(x, -1) - (1.0 - eps) * chosen,
            log_normalizer)


@tf.function(jit_compile=True)
def _xla_backward(logits, labels, log_normalizer, upstream, eps):
    """(softmax - t) * upstream [N, V] in one fused pass, in the logits' dtype."""
    x = tf.cast(logits, tf.float32)
    vocab = tf.shape(x)[-1]
    off = eps / tf.cast(vocab, tf.float32)
    target = tf.one_hot(labels, vocab, on_value=1.0 - eps + off, off_value=off)
    return tf.cast((tf.exp(x - log_normalizer[:, None]) - target) * upstream[:, None],
                   logits.dtype)


def xla_cross_entropy(labels, logits, label_smoothing):
    """The loss and its gradient, each compiled by XLA (once per token count)."""
    shape = tf.shape(logits)
    flat = tf.reshape(logits, [-1, shape[-1]])
    flat_labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    eps = tf.constant(label_smoothing, tf.float32)

    @tf.custom_gradient
    def cross_entropy(flat):
        losses, log_normalizer = _xla_forward(flat, flat_labels, eps)
        return losses, lambda upstream: _xla_backward(flat, flat_labels, log_normalizer,
                                                      upstream, eps)

    return tf.reshape(cross_entropy(flat), shape[:-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(args.tokens, args.vocab)).astype(np.float32))
    labels = tf.constant(rng.integers(0, args.vocab, args.tokens).astype(np.int32))
    from benchmarks.end_to_end import VECTOR_FLAGS
    from trainers.precision import cpu_flags, cpu_model

    present = cpu_flags()
    flags = [flag for flag in VECTOR_FLAGS if flag in present]
    print(f"CPU: {cpu_model()} ({' '.join(flags)}); "
          f"loss and gradient, {args.tokens} tokens x {args.vocab}, median of 2 rounds of "
          f"{args.repeats}")
    variants = {"smoothed_cross_entropy (TensorFlow's kernel)": losses.smoothed_cross_entropy,
                "smoothed_cross_entropy_formula": losses.smoothed_cross_entropy_formula,
                "xla_cross_entropy": xla_cross_entropy}
    for name, cross_entropy in variants.items():
        rounds = [step_ms(cross_entropy, labels, logits, args.repeats) for _ in range(2)]
        print(f"{name}: {np.median(rounds):.0f} ms")


if __name__ == "__main__":
    main()
