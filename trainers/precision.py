"""`--precision auto`: bfloat16 where the hardware computes it natively, float16 on GPUs that
have tensor cores for float16 only, float32 elsewhere.

mixed_bfloat16 halves the matrix products' cost on TPUs, on GPUs of compute capability 8.0 and
newer (A100, H100, ...) and on CPUs with AMX or AVX512-BF16 (oneDNN uses those units). On other
CPUs TensorFlow emulates bfloat16 and a step is slower than in float32, so auto picks float32
there (README, "Precision").
GPUs of compute capability 7.x (V100, T4: Colab's free GPU) have float16 tensor cores and no
bfloat16: auto picks mixed_float16 there, with dynamic loss scaling
(`kt.TokenWeightedLossScaleOptimizer`).
"""

import pathlib

import tensorflow as tf

from keras_transformer.compiled import CPU_BF16_FLAGS, cpu_flags


def cpu_model(cpuinfo="/proc/cpuinfo"):
    try:
        for line in pathlib.Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def gpu_capabilities():
    """The compute capability (major, minor) of each visible GPU."""
    return [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability")
                  or (0, 0)) for gpu in tf.config.list_physical_devices("GPU")]


def choose_precision(requested, strategy, flags=None, capabilities=None):
    """(policy name, reason) for `--precision requested` under `strategy`; `flags` (the CPU's)
    and `capabilities` (the GPUs') are read from this machine unless given."""
    if requested != "auto":
        return requested, "as asked"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16", "TPU: bfloat16 is native"
    capabilities = gpu_capabilities() if capabilities is None else capabilities
    if capabilities:
        oldest = min(capabilities)
        if oldest >= (8, 0):
            return "mixed_bfloat16", f"GPU(s) of compute capability {oldest}: bfloat16 is native"
        if oldest >= (7, 0):
            return "mixed_float16", (f"GPU(s) of compute capability {oldest}: float16 tensor "
                                     "cores, no bfloat16")
        return "float32", f"GPU(s) of compute capability {oldest}: no float16 tensor cores"
    flags = cpu_flags() if flags is None else flags
    native = sorted(set(flags) & set(CPU_BF16_FLAGS))
    if native:
        return "mixed_bfloat16", f"CPU with {', '.join(native)}: bfloat16 is native"
    return "float32", "CPU without AMX or AVX512-BF16: bfloat16 would be emulated, slower"
