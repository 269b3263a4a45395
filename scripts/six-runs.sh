#!/usr/bin/env bash
# The six runs whose per-round numbers a refactor must not change (5 rounds each), and
# their comparison with an earlier set:
#   bash scripts/six-runs.sh OUT               # run them into OUT/<name>/
#   bash scripts/six-runs.sh OUT --against OLD # ... then compare OUT with OLD as floats
# Both sets must come from the same machine (CPU kind and threads).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: six-runs.sh OUT [--against OLD]}
against=""
if [[ "${2:-}" == "--against" ]]; then against=${3:?--against needs a folder}; fi
python=${PYTHON:-.venv/bin/python}
runs=(
  fmnist-las/fedseal
  fmnist-las/fedmatch
  fmnist-las/fedavg_fixmatch
  ssfl-fmnist/grouping_gn
  fmnist-open/fedossl
  fmnist-fedsup/fedsup
)
for exp in "${runs[@]}"; do
  name=${exp//\//-}
  if [[ -f "$out/$name/results.json" ]]; then continue; fi
  start=$(date +%s)
  "$python" -m ssfl.cli run "$exp" --rounds 5 --out "$out/$name" --quiet --overwrite
  echo "$name: $(($(date +%s) - start)) s"
done
if [[ -n "$against" ]]; then
  "$python" - "$out" "$against" "${runs[@]}" <<'EOF'
import json, sys
from pathlib import Path

new, old, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
bad = 0
for exp in names:
    name = exp.replace("/", "-")
    rows = [json.loads((d / name / "results.json").read_text())["rounds"] for d in (new, old)]
    strip = [[{k: v for k, v in r.items() if "seconds" not in k} for r in rs] for rs in rows]
    same = strip[0] == strip[1]
    bad += not same
    accs = " ".join(f"{r['test_accuracy']:.6f}" for r in rows[0])
    print(f"{name}: {'identical' if same else 'DIFFERENT'} ({accs})")
sys.exit(1 if bad else 0)
EOF
fi
