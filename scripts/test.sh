#!/usr/bin/env bash
# Set up (if needed), lint, and run the tests.
#   bash scripts/test.sh          the everyday tier (under 5 minutes on a 2-core CPU): every
#                                 test not marked slow, e2e or process, on one pytest worker a
#                                 core (at most 8; SSFL_TEST_WORKERS sets it, 0: no workers)
#   bash scripts/test.sh --all    every test (what CI runs), in one process
# Further arguments go to pytest, e.g. bash scripts/test.sh tests/test_losses.py -x
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ruff check .
if [ "${1:-}" = "--all" ]; then
  shift
  python -m pytest -q "$@"
else
  workers=${SSFL_TEST_WORKERS:-$(nproc)}
  [[ $workers =~ ^[0-9]+$ ]] || { echo "test.sh: SSFL_TEST_WORKERS=$workers: expected a whole number (0: no workers)" >&2; exit 2; }
  [ "$workers" -le 8 ] || workers=8
  python -m pytest -q -m "not (slow or e2e or process)" -n "$workers" "$@"
fi
