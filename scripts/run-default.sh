#!/usr/bin/env bash
# Set up (if needed) and run the default experiment on Fashion-MNIST. Data comes from
# $SSFL_DATA_DIR, else ../shared/data, else ./data (downloaded there on first use).
# Extra arguments go to `ssfl run` (e.g. --rounds 10 --set client.lr=0.02).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ssfl run experiments/fmnist-las/fedseal.yaml "$@"
