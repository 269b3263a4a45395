#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ruff check .
python -m pytest -q "$@"
