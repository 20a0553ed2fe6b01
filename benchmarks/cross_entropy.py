"""The label-smoothed cross-entropy and its gradient on TensorFlow: the library's
(`losses.smoothed_cross_entropy`: XLA-compiled, the token count padded to a few shapes, logits
cast up from bfloat16 read as bfloat16), TensorFlow's fused kernel (what the library ran
before; see benchmarks/results/cross_entropy.md) and the backend-agnostic formula
(`losses.smoothed_cross_entropy_formula`, what JAX and PyTorch run), each on float32 logits
and on bfloat16 logits cast up to float32 (what the model gives under mixed_bfloat16).

    python -m benchmarks.cross_entropy [--tokens 4000] [--vocab 8000] [--repeats 20]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from keras_transformer import losses


def step_ms(cross_entropy, labels, logits, repeats):
    """Mean ms over `repeats` of the loss and its gradient to `logits` (cast up to float32
    inside the step when they are bfloat16, as the model does)."""
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            z = tf.identity(logits)
            tape.watch(z)
            loss = tf.reduce_sum(cross_entropy(labels, tf.cast(z, tf.float32), 0.1))
        return loss, tape.gradient(loss, z)

    step()[1].numpy()
    began = time.perf_counter()
    for _ in range(repeats):
        step()[1].numpy()
    return (time.perf_counter() - began) / repeats * 1000


def fused_kernel_cross_entropy(labels, logits, label_smoothing):
    """TensorFlow's fused softmax cross-entropy on the smoothed one-hot target (what
    `losses.smoothed_cross_entropy` ran before it was compiled by XLA)."""
    vocab = tf.shape(logits)[-1]
    off = label_smoothing / tf.cast(vocab, tf.float32)
    target = tf.one_hot(tf.cast(labels, tf.int32), vocab,
                        on_value=1.0 - label_smoothing + off, off_value=off)
    return tf.nn.softmax_cross_entropy_with_logits(target, tf.cast(logits, tf.float32))


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
    variants = {"smoothed_cross_entropy (the library's, XLA)": losses.smoothed_cross_entropy,
                "fused_kernel_cross_entropy (TensorFlow's kernel)": fused_kernel_cross_entropy,
                "smoothed_cross_entropy_formula": losses.smoothed_cross_entropy_formula}
    for dtype in (tf.float32, tf.bfloat16):
        for name, cross_entropy in variants.items():
            rounds = [step_ms(cross_entropy, labels, tf.cast(logits, dtype), args.repeats)
                      for _ in range(2)]
            print(f"{dtype.name} logits, {name}: {np.median(rounds):.0f} ms")


if __name__ == "__main__":
    main()
