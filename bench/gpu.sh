#!/usr/bin/env bash
# MLM train-step benchmark on one NVIDIA GPU: bf16 compute, `fused` (cuDNN) attention,
# MFU against the H200's dense bf16 peak (989 TFLOP/s). Run once on an H200 (jax 0.11.2,
# CUDA 13) before the embedding fix; see docs/performance.md.
#
#   bench/gpu.sh                 # run (needs jax with CUDA in $PY's environment)
#   bench/gpu.sh --dry-run       # print the commands only (works on any machine)
#   PEAK_TFLOPS=... bench/gpu.sh # another GPU's datasheet peak
#
# jax with CUDA in the project venv (same jax version as the CPU one; cuda13 for CUDA 13):
#   .venv/bin/pip install "jax[cuda12]==$(.venv/bin/python -c 'import jax; print(jax.__version__)')"
# or PY=python3 with an environment that already has CUDA jax and the project's deps.
# Attention dropout is switched off: with it on, `fused` falls back to the einsum path
# (jax.nn.dot_product_attention has no dropout), so cuDNN would not be measured.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The orchestrator and each contender are separate processes on one GPU: no process
# may grab 75% of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
ROUNDS=${ROUNDS:-10}
DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1

COMMON=(bench/train_step.py --frameworks "${FRAMEWORKS:-jaxencoder,jaxencoder_full}" --dtype bfloat16
        --attention fused --no-attention-dropout --peak-tflops "$PEAK_TFLOPS"
        --rounds "$ROUNDS" --steps-per-round 5)
# (config, batch): B*L = 32k tokens per step for both sequence lengths.
RUNS=("small128 256" "base128 256" "base512 64")

run() {
  echo "+ $*" >&2
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}

if [[ $DRY_RUN == 0 ]]; then
  backend=$("$PY" -c 'import jax; print(jax.default_backend())')
  if [[ "$backend" != "gpu" ]]; then
    echo "bench/gpu.sh: jax backend is '$backend', not 'gpu'; install CUDA jax (see header)" >&2
    exit 1
  fi
  "$PY" -c 'import jax; print(jax.devices())'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
fi
for spec in "${RUNS[@]}"; do
  read -r config batch <<<"$spec"
  run "$PY" "${COMMON[@]}" --configs "$config" --batch-size "$batch"
done
