"""The label-smoothed cross-entropy and its gradient on TensorFlow, both ways the library
computes it: TensorFlow's fused kernel (`losses.smoothed_cross_entropy` there) and the
backend-agnostic formula (`losses.smoothed_cross_entropy_formula`, what JAX and PyTorch run).

    python -m benchmarks.cross_entropy [--tokens 4000] [--vocab 8000] [--repeats 20]
"""

import argparse
import platform
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(args.tokens, args.vocab)).astype(np.float32))
    labels = tf.constant(rng.integers(0, args.vocab, args.tokens).astype(np.int32))
    print(f"CPU: {platform.processor() or platform.machine()}; loss and gradient, "
          f"{args.tokens} tokens x {args.vocab}, median of 2 rounds of {args.repeats}")
    for name in ("smoothed_cross_entropy", "smoothed_cross_entropy_formula"):
        rounds = [step_ms(getattr(losses, name), labels, logits, args.repeats) for _ in range(2)]
        print(f"{name}: {np.median(rounds):.0f} ms")


if __name__ == "__main__":
    main()
