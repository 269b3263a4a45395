#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if [ -z "${SSFL_DATA_DIR:-}" ] && [ -d ../shared/data/fashion-mnist ]; then
  export SSFL_DATA_DIR="$(cd ../shared/data && pwd)"
fi
ruff check .
python -m pytest -q "$@"
