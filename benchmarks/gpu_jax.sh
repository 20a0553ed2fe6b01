#!/usr/bin/env bash
# benchmarks/gpu_jax.py on a GPU machine that has JAX but no TensorFlow and no package registry.
#   bash benchmarks/gpu_jax.sh fetch   here, where pip reaches a registry: keras and the two of
#                                      its needs such a machine lacks, as wheels, into .whl/
#   bash benchmarks/gpu_jax.sh         there: installs .whl/ into /tmp/site, runs the benchmark
#                                      (base, mixed_bfloat16), then float32; results in
#                                      benchmarks/results/gpu_jax*.json (and $OUT, if set)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == fetch ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    keras_version=$(python3 -c "import keras; print(keras.__version__)")
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        "keras==$keras_version" namex optree
    exit
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -m benchmarks.gpu_jax --out benchmarks/results/gpu_jax.json
python3 -m benchmarks.gpu_jax --precision float32 --steps 20 --beam_batches 2 \
    --out benchmarks/results/gpu_jax_float32.json
if [[ -n "${OUT:-}" ]]; then cp benchmarks/results/gpu_jax*.json "$OUT"/; fi
