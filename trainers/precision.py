"""`--precision auto`: bfloat16 where the hardware computes it natively, float32 elsewhere.

mixed_bfloat16 halves the matrix products' cost on TPUs, on GPUs of compute capability 8.0 and
newer (A100, H100, ...) and on CPUs with AMX or AVX512-BF16 (oneDNN uses those units). On other
CPUs TensorFlow emulates bfloat16 and a step is slower than in float32 (measured on an
AVX2-only EPYC: 650-730 against 1,040-1,070 target tokens/s), so auto picks float32 there.
"""

import pathlib

import tensorflow as tf

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


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


def cpu_model(cpuinfo="/proc/cpuinfo"):
    try:
        for line in pathlib.Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def choose_precision(requested, strategy, flags=None):
    """(policy name, reason) for `--precision requested` under `strategy`."""
    if requested != "auto":
        return requested, "as asked"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16", "TPU: bfloat16 is native"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")
                        for gpu in gpus]
        if all(c and tuple(c) >= (8, 0) for c in capabilities):
            return "mixed_bfloat16", f"GPU(s) of compute capability {capabilities[0]}: bfloat16 is native"
        return "float32", f"GPU(s) of compute capability {capabilities[0]}: no native bfloat16"
    flags = cpu_flags() if flags is None else flags
    native = sorted(set(flags) & set(CPU_BF16_FLAGS))
    if native:
        return "mixed_bfloat16", f"CPU with {', '.join(native)}: bfloat16 is native"
    return "float32", "CPU without AMX or AVX512-BF16: bfloat16 would be emulated, slower"
