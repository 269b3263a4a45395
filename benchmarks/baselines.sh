#!/usr/bin/env bash
# The five baselines on fmnist-las (IID, seed 0), then one table and one plot:
#   bash benchmarks/baselines.sh 50 results/baselines-fmnist-las
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-50}
OUT=${2:-results/baselines-fmnist-las}
shift 2 || true
for m in server_sl fedavg_sl fedprox_sl fedavg_fixmatch fedavg_uda; do
  ssfl run "experiments/fmnist-las/$m.yaml" --rounds "$ROUNDS" --out "$OUT/$m" --quiet "$@"
done
ssfl compare "$OUT"/server_sl "$OUT"/fedavg_sl "$OUT"/fedprox_sl "$OUT"/fedavg_fixmatch \
  "$OUT"/fedavg_uda --plot "$OUT/accuracy.png" | tee "$OUT/table.md"
