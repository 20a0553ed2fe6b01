#!/usr/bin/env bash
# The same comparison on a GPU machine, in under five minutes on one modern GPU:
#   bash benchmarks/gpu.sh            (from the repository root, after `pip install -e .`)
# Writes benchmarks/results/gpu/{training,decoding}.{json,md} and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -m benchmarks.run_all --presets tiny,base --steps 20 --repeats 3 \
    --out_dir benchmarks/results/gpu
