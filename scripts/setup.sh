#!/usr/bin/env bash
# Create .venv and install ssfl with its test tools. Pins torch/torchvision so that a
# CPU-only machine does not pull the multi-GB CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0" "torchvision==0.28.0"
python -m pip install -q -e ".[test]"
