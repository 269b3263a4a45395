#!/usr/bin/env bash
# One check of a GPU box in minutes: writes one JSON (default gpu-check.json).
#   bash scripts/gpu-check.sh [FILE | --json FILE] [--cpu] [--methods a,b] [--budget SECONDS]
#     [--steps a,b] [--execution per_client|cohort] [--engine auto|kornia|batched]
#     [--partial-sums] [--keep DIR]
# Uses ${PYTHON:-python3} as it is: no venv, nothing installed. The repo need not be
# pip-installed (its root goes on PYTHONPATH); Flower's executables are found on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export SSFL_DATA_DIR="${SSFL_DATA_DIR:-$ROOT/data}"
exec "${PYTHON:-python3}" -m benchmarks.gpu_check "$@"
