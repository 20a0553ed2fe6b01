"""What the passes TensorFlow hands to XLA share (the loss, losses.py; training's Add & Norm
under mixed_bfloat16, layer_norm.py): row counts padded to a few shapes, bfloat16 converted
on its bits, whether a trace is one XLA compiles, and whether a pass pays on this machine.
TensorFlow only."""

import functools
import pathlib

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # the XLA context: no public equivalent


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        text = pathlib.Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# The feature flags of CPUs that compute bfloat16 natively (oneDNN uses those units); where
# there are none TensorFlow emulates it.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def add_and_norm_pays_here():
    """Whether training's Add & Norm compiled by XLA (layer_norm.compiled_add_and_norm) beats
    TensorFlow's separate ops on this machine: on a CPU that computes bfloat16 natively (AMX
    or AVX512-BF16), with no GPU. It did on an Intel Xeon with AMX and on an AMD Zen 4 with
    AVX512-BF16; GPUs and emulated bfloat16 were not measured
    (benchmarks/results/add_and_norm.md)."""
    return bool(cpu_flags() & set(CPU_BF16_FLAGS)) and on_cpus_only()


def in_xla_function():
    """Whether TensorFlow is tracing a function that XLA will compile (`jit_compile=True`, or
    inside one, or a TPU computation)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@functools.cache
def on_cpus_only():
    """Whether TensorFlow sees no GPU, so that what was measured on CPUs applies."""
    return not tf.config.list_logical_devices("GPU")


# Padded row counts are multiples of this (the compiled Add & Norm sums its rows in groups
# of it).
ROW_MULTIPLE = 8


def padding_to_multiple(rows, multiple):
    """How many rows to add to `rows` (a scalar tensor) to reach a multiple of `multiple`."""
    return (multiple - rows % multiple) % multiple


def padding_rows(rows):
    """How many rows to add to `rows` (a scalar tensor) to reach the next of 8 sizes per power
    of two (a multiple of ROW_MULTIPLE at least): XLA compiles once per shape, and a batch's
    token count changes from batch to batch; padded, they share a handful of programs, at
    most 1/8 more rows each."""
    octave = tf.cast(tf.math.floor(tf.math.log(tf.cast(tf.maximum(rows, 1), tf.float32))
                                   / tf.math.log(2.0)), tf.int32)
    granule = tf.maximum(tf.bitwise.left_shift(1, tf.maximum(octave - 3, 0)), ROW_MULTIPLE)
    return padding_to_multiple(rows, granule)


# bfloat16 is the upper half of a float32's bits. XLA's CPU code for a convert between the two
# inside these passes was 1.7-1.9x slower than the same conversion done on the bits with integer
# ops (benchmarks/results/cross_entropy.md), so the compiled passes convert bfloat16 that way.

def widened(x):
    """x as float32; bfloat16 widened by shifting its bits into the upper half."""
    if x.dtype != tf.bfloat16:
        return tf.cast(x, tf.float32)
    bits = tf.cast(tf.bitcast(x, tf.uint16), tf.uint32)
    return tf.bitcast(tf.bitwise.left_shift(bits, 16), tf.float32)


def rounded(x, dtype):
    """float32 x in `dtype`; to bfloat16 by rounding its bits to the nearest even upper half
    (what `tf.cast` does), NaN kept NaN."""
    if dtype != tf.bfloat16:
        return tf.cast(x, dtype)
    bits = tf.bitcast(x, tf.uint32)
    lowest_kept = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 16), 1)
    upper = tf.bitwise.right_shift(bits + 0x7FFF + lowest_kept, 16)
    upper = tf.where(tf.math.is_nan(x), tf.constant(0x7FC0, tf.uint32), upper)
    return tf.bitcast(tf.cast(upper, tf.uint16), tf.bfloat16)
