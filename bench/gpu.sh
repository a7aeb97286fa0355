#!/usr/bin/env bash
# The BERT-base MLM train step on one NVIDIA GPU, jaxencoder and its PyTorch anchor
# (eager and torch.compile) measured side by side in the same run, in under 8 minutes:
# bench/gpu_bench.py (contenders, flags, output), docs/performance.md ("H200, bench/gpu.sh").
#
#   bench/gpu.sh                      # results in $OUT if set, else bench/results/
#   bench/gpu.sh --dry-run            # print the contender commands (works on any machine)
#   bench/gpu.sh --report DIR         # rebuild DIR/report.md from DIR/results.jsonl
#   bench/gpu.sh --deadline 300 ...   # any other bench/gpu_bench.py flag
#
# PY: a python with CUDA jax, flax, optax, orbax, torch and transformers; default
# .venv/bin/python where it exists (CPU jax: it will say so), else python3 (the H200
# image's). Wheels in .whl/ are installed into a temporary directory first: the H200
# image lacks ml_collections, which jaxencoder's optimizer imports.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [[ " $* " != *" --dry-run "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" bench/gpu_bench.py "$@"
