#!/usr/bin/env bash
# Set up (if needed), lint, and run the tests.
#   bash scripts/test.sh          the everyday tier (under 5 minutes on a 2-core CPU): every
#                                 test not marked slow, e2e or process
#   bash scripts/test.sh --all    every test (what CI runs)
# Further arguments go to pytest, e.g. bash scripts/test.sh tests/test_losses.py -x
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ruff check .
if [ "${1:-}" = "--all" ]; then
  shift
  python -m pytest -q "$@"
else
  python -m pytest -q -m "not (slow or e2e or process)" "$@"
fi
