#!/usr/bin/env bash
# The container path end to end on this host (docs/deployment.md, "Containers"), with TLS and
# SuperNode authentication: builds the local Debian base, the wheelhouse and the image (all
# reused when already there), starts the SuperLink, the ServerApp's SuperExec and node 0
# (its Fashion-MNIST partition) from docker-compose.yml, and node 1 as an edge machine
# (docker-compose.edge.yml, the edge steps of docs/deployment.md run as written) whose own
# data folder holds partition 1's images. Then:
#   1. 2 rounds of fedavg_fixmatch: results.json must equal `ssfl run` in simulation to
#      4 decimals, with both nodes counted every round;
#   2. a short 4-round run in which node 0's SuperNode container is SIGKILLed after round 1
#      and started again once round 2 is recorded: round 2 goes on without it (once the
#      SuperLink finds it offline), the last round counts it again;
#   3. FedSEAL (kept momentum: state a client carries between rounds) stopped after round 1,
#      the edge machine's containers removed and created again from the docs' steps (its
#      state on the node-state volume), then resumed: its rounds equal an uninterrupted
#      `ssfl run` in simulation to 4 decimals.
# Everything started here is removed at the end. Prints the wall seconds of each step.
#
#   bash scripts/compose-e2e.sh           all of it
#   bash scripts/compose-e2e.sh --image   only the image (base, wheelhouse, build), then stop
#                                         (CI builds it beside the in-process tests)
#
# Needs root or the docker group, a running Docker engine, debootstrap (for the base image)
# and the Fashion-MNIST files in $SSFL_DATA_DIR (default ../shared/data, else ./data;
# downloaded there when missing and a network is reachable). SSFL_BASE_IMAGE: another base
# image with Python 3.11 (default: docker/base-image.sh's local Debian one).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

IMAGE=ssfl:1.41.0
BASE=${SSFL_BASE_IMAGE:-ssfl-base:bookworm}
EXP=experiments/fmnist-las/fedavg_fixmatch.yaml
SERVER_PROJECT=ssfl-e2e-server-$$
EDGE_PROJECT=ssfl-e2e-edge-$$
SIM_PID=""

say() { echo "compose-e2e: $*"; }
die() {
  echo "compose-e2e: $1" >&2
  exit "${2:-1}"
}
case "$*" in
  "") IMAGE_ONLY=false ;;
  --image) IMAGE_ONLY=true ;;
  *) die "unknown arguments '$*' (expected none, or --image)" 2 ;;
esac
# step NAME COMMAND...: run it and print its wall time.
step() {
  local name=$1 start
  shift
  start=$(date +%s.%N)
  "$@"
  say "$(printf '%-34s %6.1f s' "$name" "$(echo "$(date +%s.%N) - $start" | bc)")"
}

# The compose client: the docker CLI plugin, else the standalone docker-compose.
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  die "no compose client: install docker-compose (Debian) or the docker compose plugin"
fi
docker info >/dev/null 2>&1 || die "no Docker engine answers: start dockerd (as root)"
command -v bc >/dev/null || die "no bc: apt-get install -y bc"

# The server host's compose project; its folders and port are set below.
server_compose() {
  SSFL_CERTS=$CERTS SSFL_RUNS=$SSFL_RUNS SSFL_SUPERLINK_PORT=$PORT \
    "${COMPOSE[@]}" -p "$SERVER_PROJECT" -f "$REPO/docker-compose.yml" --profile local-nodes "$@"
}

# remove_projects PROJECT...: every container and the network of each, found by label.
remove_projects() {
  local project ids
  for project in "$@"; do
    ids=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
    [ -z "$ids" ] || docker rm -f $ids >/dev/null
    docker network rm "${project}_default" >/dev/null 2>&1 || true
    ids=$(docker volume ls -q --filter "label=com.docker.compose.project=$project")
    [ -z "$ids" ] || docker volume rm $ids >/dev/null
  done
}
teardown() { remove_projects "$SERVER_PROJECT" "$EDGE_PROJECT"; }
# The projects of earlier runs killed before their teardown (SIGKILL skips the trap): their
# containers come back whenever the engine starts (restart: unless-stopped) and take CPU.
# A project is stale when the process whose PID it carries is gone.
stale_projects() {
  local project
  docker ps -a --format '{{.Label "com.docker.compose.project"}}' | sort -u |
    while read -r project; do
      if [[ $project =~ ^ssfl-e2e-(server|edge)-([0-9]+)$ ]] && [ ! -d "/proc/${BASH_REMATCH[2]}" ]; then
        echo "$project"
      fi
    done
}
# On exit: the containers' last log lines on failure, teardown, the simulation, the work folder.
# Every step is tried whatever an earlier one returns (errexit off: a killed simulation's wait
# returns 143, which used to end the cleanup before its teardown). On SIGTERM or SIGINT bash
# runs this at once and then dies of the signal.
cleanup() {
  local rc=$?
  set +e
  if [ -n "$SIM_PID" ]; then
    kill "$SIM_PID" 2>/dev/null
    wait "$SIM_PID" 2>/dev/null
  fi
  if [ "$rc" != 0 ]; then
    say "failed; last lines of each container's log:"
    for project in "$SERVER_PROJECT" "$EDGE_PROJECT"; do
      for id in $(docker ps -aq --filter "label=com.docker.compose.project=$project"); do
        echo "--- $(docker inspect -f '{{.Name}}' "$id")"
        docker logs --tail 15 "$id" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
      done
    done
  fi
  teardown
  rm -rf "$WORK"
  exit "$rc"
}
STALE=$(stale_projects)
if [ -n "$STALE" ]; then
  say "removing the containers of killed earlier runs: $(echo $STALE)"
  remove_projects $STALE
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ssfl-compose-e2e.XXXXXX")
trap cleanup EXIT

TOTAL=$(date +%s.%N)

# --- Host tools: the project's environment (flwr CLI, ssfl run for the baseline) ---------
host_env() {
  [ -x .venv/bin/python ] || bash scripts/setup.sh
  if [ -z "${SSFL_DATA_DIR:-}" ]; then
    if [ -d ../shared/data/fashion-mnist ]; then SSFL_DATA_DIR=$(cd ../shared/data && pwd); else SSFL_DATA_DIR=$REPO/data; fi
  fi
  mkdir -p "$SSFL_DATA_DIR"
  export SSFL_DATA_DIR FLWR_HOME=$WORK/flwr FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
}
step "host environment" host_env
PY=$REPO/.venv/bin/python
FLWR=$REPO/.venv/bin/flwr

# --- Image: local Debian base, wheelhouse for its Python, offline build --------------------
base_image() {
  if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    [ "$BASE" = ssfl-base:bookworm ] || die "base image $BASE not found"
    bash docker/base-image.sh "$BASE"
  fi
}
step "base image ($BASE)" base_image
# Reused while the base's Python and pyproject.toml (the dependencies) are unchanged.
wheelhouse() {
  local py stamp
  py=$(docker run --rm "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  stamp="python $py, pyproject $(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f docker/wheels/requirements.txt ] || [ "$(cat docker/wheels/stamp.txt 2>/dev/null)" != "$stamp" ]; then
    rm -rf docker/wheels
    PYTHON=$PY bash scripts/wheelhouse.sh docker/wheels --torch cpu --for image --python-version "$py"
    echo "$stamp" >docker/wheels/stamp.txt
  fi
}
step "wheelhouse (CPU torch)" wheelhouse
build_image() {
  DOCKER_BUILDKIT=0 docker build -q -f docker/Dockerfile --build-arg BASE="$BASE" -t "$IMAGE" . \
    >/dev/null 2>"$WORK/build.log" || die "image build failed: $(tail -5 "$WORK/build.log")"
  say "image $IMAGE: $(docker run --rm "$IMAGE" python3 --version), flwr $(docker run --rm "$IMAGE" flwr --version | tr -dc '0-9.')"
}
step "image build (offline)" build_image
if $IMAGE_ONLY; then
  say "$(printf '%-34s %6.1f s' "total (--image: stops here)" "$(echo "$(date +%s.%N) - $TOTAL" | bc)")"
  exit 0
fi
save_image() {
  mkdir -p "$WORK/edge"
  docker save -o "$WORK/edge/ssfl-image.tar" "$IMAGE"
}
step "docker save (the edge's copy)" save_image

# --- Data: node 1's own folder holds partition 1's unlabeled images ------------------------
export_partition() {
  "$PY" - "$EXP" "$WORK/edge/node1.npy" <<'EOF'
import sys

import numpy as np
import torch

from client_app.base import client_data
from ssfl.experiment import resolve_experiment
from ssfl.registry import settings_of

settings = settings_of(resolve_experiment(sys.argv[1], 2, 2, []))
images = client_data(settings, 1, torch.device("cpu")).x.mul(255).round().to(torch.uint8)
np.save(sys.argv[2], images.numpy())
print(f"compose-e2e: node 1's data folder: {len(images)} images of partition 1")
EOF
}
step "partition 1 as a data folder" export_partition

# --- Baseline: the same experiment in simulation, in the background ------------------------
"$PY" -m ssfl.cli run "$EXP" --nodes 2 --rounds 2 --out "$WORK/sim" --quiet >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
SIM_START=$(date +%s.%N)

# --- Server host: certificates and node 0's key by one command, then the containers --------
export SSFL_UID SSFL_GID
SSFL_UID=$(id -u)
SSFL_GID=$(id -g)
HOST_IP=$(hostname -I | awk '{print $1}')
PORT=$("$PY" -c 'from ssfl.runner import free_port; print(free_port())')
CERTS=$WORK/server/certs
SSFL_RUNS=$WORK/server/runs
start_server() {
  mkdir -p "$CERTS" "$SSFL_RUNS"
  docker run --rm -u "$SSFL_UID:$SSFL_GID" -v "$CERTS:/app/certs" "$IMAGE" \
    python -m ssfl.certs certs --host superlink --host "$HOST_IP" --nodes 1
  server_compose up -d --no-build superlink superexec-serverapp supernode-0 superexec-clientapp-0 2>&1 | grep -v '^Creating\|^Starting' || true
  mkdir -p "$FLWR_HOME"
  printf '[superlink]\ndefault = "ssfl"\n\n[superlink.ssfl]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n' \
    "$PORT" "$CERTS/ca.crt" >"$FLWR_HOME/config.toml"
  "$PY" - "$PORT" "$CERTS/ca.crt" <<'EOF'
import sys
import time

from ssfl.runner import http_ok

deadline = time.monotonic() + 120
while not http_ok(f"https://127.0.0.1:{sys.argv[1]}/health", sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit("compose-e2e: the SuperLink container did not answer over TLS in 120 s")
    time.sleep(1)
EOF
  "$FLWR" supernode register "$CERTS/node0.pub" ssfl | tail -1
}
step "server host up (TLS, node auth)" start_server

# --- Edge machine: the steps of docs/deployment.md, as written -----------------------------
# doc_block MARKER: the bash block that follows "<!-- MARKER -->" in docs/deployment.md, with
# the example SuperLink address replaced by this one and the compose client of this host.
doc_block() {
  awk -v marker="<!-- $1 -->" '$0 == marker {on = 1; next} on && /^```bash/ {inside = 1; next}
    inside && /^```/ {exit} inside {print}' docs/deployment.md |
    sed -e "s/server.example.org:8000/$HOST_IP:$PORT/g" -e "s/docker compose /${COMPOSE[*]} /g"
}
start_edge() {
  local prepare start check
  prepare=$(doc_block edge-prepare)
  start=$(doc_block edge-start)
  check=$(doc_block edge-check)
  [ -n "$prepare" ] && [ -n "$start" ] && [ -n "$check" ] ||
    die "docs/deployment.md lost its edge-prepare, edge-start or edge-check block"
  cp docker-compose.edge.yml "$WORK/edge/"
  cp "$CERTS/ca.crt" "$WORK/edge/"
  # What the edge host holds now: the image archive, the compose file, ca.crt, its images.
  (cd "$WORK/edge" && COMPOSE_PROJECT_NAME=$EDGE_PROJECT bash -euo pipefail -c "$prepare" >/dev/null)
  mv "$WORK/edge/node1.npy" "$WORK/edge/images/"
  # The operator registers the edge node's public key.
  "$FLWR" supernode register "$WORK/edge/certs/node.pub" ssfl | tail -1
  (cd "$WORK/edge" && COMPOSE_PROJECT_NAME=$EDGE_PROJECT bash -euo pipefail -c "$start" 2>&1 |
    grep -v '^Creating\|^Starting' || true)
  (cd "$WORK/edge" && COMPOSE_PROJECT_NAME=$EDGE_PROJECT bash -euo pipefail -c "$check" 2>&1 |
    grep "SuperNode ID") || die "the edge node did not log its SuperNode ID in 120 s"
}
step "edge node up (docs' steps)" start_edge

# Both nodes online, as the operator checks it.
nodes_online() {
  local deadline=$((SECONDS + 120))
  until [ "$("$FLWR" supernode ls ssfl --format json | "$PY" -c '
import json, sys
print(sum(n["status"] == "online" for n in json.load(sys.stdin)["nodes"]))')" = 2 ]; do
    [ $SECONDS -lt $deadline ] || die "the two SuperNodes are not online after 120 s"
    sleep 2
  done
  "$FLWR" supernode ls ssfl | grep -i online || true
}
step "both nodes registered and online" nodes_online

# run_config NAME OVERRIDES [EXPERIMENT] [MORE]: the run config of a run on the containers.
run_config() {
  echo "experiment='${3:-$EXP}' overrides='$2;dataset.root=/app/data' out-dir='/app/runs/$1'${4:+ $4}"
}
# run_status RUN_ID: e.g. finished:completed, running.
run_status() {
  "$PY" -c "import os; from ssfl.runner import run_status; print(run_status(os.environ, 'ssfl', '$1'))"
}
# submit NAME OVERRIDES [EXPERIMENT] [MORE]: run the experiment on the containers (MORE: more
# run config, e.g. resume=true); results in $SSFL_RUNS/NAME.
submit() {
  local name=$1 output run_id status
  mkdir -p "$WORK/app"
  output=$("$FLWR" run "$(stage_app)" ssfl --stream --run-config "$(run_config "$@")" 2>&1) ||
    die "flwr run failed: $(echo "$output" | tail -3)"
  echo "$output" >"$WORK/$name.log"
  run_id=$(echo "$output" | grep -o 'Successfully started run [0-9]*' | grep -o '[0-9]*$') ||
    die "flwr run did not start the run: $(echo "$output" | tail -1)"
  status=$(run_status "$run_id")
  [ "$status" = finished:completed ] || die "run $run_id ended as $status"
  [ -f "$SSFL_RUNS/$name/results.json" ] || die "run $run_id wrote no results.json"
}
# The app as `flwr run` packs it (pyproject.toml, packages, experiments), staged once.
stage_app() {
  [ -f "$WORK/app/pyproject.toml" ] || "$PY" -c "
from pathlib import Path
from ssfl.runner import APP_DIR, stage_app
stage_app(APP_DIR, Path('$WORK/app'))"
  echo "$WORK/app"
}

# --- 1. Two rounds on the containers, equal to simulation -----------------------------------
step "run: 2 rounds on the containers" submit e2e "rounds=2;split.num_clients=2"
wait_simulation() {
  wait "$SIM_PID" || die "ssfl run (simulation) failed: $(tail -3 "$WORK/sim.log")"
  SIM_PID=""
  say "$(printf '%-34s %6.1f s' "  (simulation ran since)" "$(echo "$(date +%s.%N) - $SIM_START" | bc)")"
}
step "simulation baseline finished" wait_simulation
"$PY" - "$SSFL_RUNS/e2e/results.json" "$WORK/sim/results.json" <<'EOF'
import json
import sys

deployed, simulated = (json.load(open(path))["rounds"] for path in sys.argv[1:])
assert [r["round"] for r in deployed] == [r["round"] for r in simulated] == [1, 2], "rounds"
for d, s in zip(deployed, simulated):
    assert d["clients"] == 2 and d["failures"] == 0, f"round {d['round']}: {d}"
    for key in ("test_accuracy", "test_loss"):
        assert round(d[key], 4) == round(s[key], 4), f"round {d['round']} {key}: {d[key]} != {s[key]}"
    print(
        f"compose-e2e: round {d['round']}: test accuracy containers {d['test_accuracy']:.4f}, "
        f"simulation {s['test_accuracy']:.4f}; clients {d['clients']} (edge node included)"
    )
EOF

# --- 2. Node 0's SuperNode container killed mid-run and started again ----------------------
# wait_round N [NAME]: until run NAME (default: the fault run) has recorded round N.
wait_round() {
  local deadline=$((SECONDS + 600)) rows=$SSFL_RUNS/${2:-fault}/metrics.jsonl
  until [ -f "$rows" ] && grep -q "\"round\": $1[,}]" "$rows"; do
    [ $SECONDS -lt $deadline ] || die "round $1 of the ${2:-fault} run not recorded in 600 s"
    sleep 0.2
  done
}
fault_run() {
  # client.epochs=12: node 0's round-2 training lasts seconds, so the kill below lands in it
  # (with 1 epoch, 300 images, an idle machine could finish round 2 before the kill).
  submit fault "rounds=4;split.num_clients=2;split.client_size=300;split.test_size=500;server.bootstrap_epochs=1;server.epochs=1;client.epochs=12" &
  local runner=$!
  wait_round 1
  server_compose kill supernode-0 2>&1 | grep -v '^Killing' || true
  say "round 1 recorded: node 0's SuperNode container killed"
  wait_round 2
  server_compose start supernode-0 2>&1 | grep -v '^Starting' || true
  say "round 2 recorded: node 0's SuperNode container started again"
  wait "$runner" || die "the fault run failed"
  "$PY" - "$SSFL_RUNS/fault/results.json" <<'EOF'
import json
import sys

rows = json.load(open(sys.argv[1]))["rounds"]
assert [r["round"] for r in rows] == [1, 2, 3, 4], rows
assert rows[0]["clients"] == 2 and rows[0]["failures"] == 0, rows[0]
assert rows[1]["failed_partitions"] == [0] and rows[1]["clients"] == 1, rows[1]
assert rows[3]["clients"] == 2 and rows[3]["failures"] == 0, rows[3]
print(
    "compose-e2e: fault run: round 2 went on without node 0 "
    f"(failed_partitions {rows[1]['failed_partitions']}, {rows[1]['seconds']:.0f} s); "
    f"round 3: clients {rows[2]['clients']}; round 4 counted it again "
    f"(clients {rows[3]['clients']}, failures {rows[3]['failures']})"
)
EOF
}
step "run: node killed and restarted" fault_run

# --- 3. FedSEAL resumed after the edge machine's containers were re-created ----------------
SEAL_EXP=experiments/fmnist-las/fedseal.yaml
SEAL_SETS="rounds=3;split.num_clients=2;server.bootstrap_epochs=2;client.keep_momentum=true"
# The uninterrupted run, in simulation (the same split: node 1's folder is partition 1).
seal_simulation() {
  "$PY" -m ssfl.cli run "$SEAL_EXP" --nodes 2 --rounds 3 --set server.bootstrap_epochs=2 \
    --set client.keep_momentum=true --out "$WORK/sim-seal" --quiet >"$WORK/sim-seal.log" 2>&1 ||
    die "ssfl run (FedSEAL simulation) failed: $(tail -3 "$WORK/sim-seal.log")"
}
# The edge machine's containers removed (stopped first, so its SuperNode leaves the SuperLink)
# and created again by the docs' start step; the node-state volume stays.
recreate_edge() {
  local ids start
  start=$(doc_block edge-start)
  ids=$(docker ps -aq --filter "label=com.docker.compose.project=$EDGE_PROJECT")
  docker stop $ids >/dev/null && docker rm $ids >/dev/null
  (cd "$WORK/edge" && COMPOSE_PROJECT_NAME=$EDGE_PROJECT bash -euo pipefail -c "$start" 2>&1 |
    grep -v '^Creating\|^Starting' || true)
}
seal_resumed() {
  local output run_id deadline sim
  seal_simulation &
  sim=$!
  output=$("$FLWR" run "$(stage_app)" ssfl --run-config "$(run_config seal "$SEAL_SETS" "$SEAL_EXP")" 2>&1) ||
    die "flwr run (FedSEAL) failed: $(echo "$output" | tail -3)"
  run_id=$(echo "$output" | grep -o 'Successfully started run [0-9]*' | grep -o '[0-9]*$') ||
    die "flwr run did not start the FedSEAL run: $(echo "$output" | tail -1)"
  wait_round 1 seal
  "$FLWR" stop "$run_id" ssfl >/dev/null 2>&1 || die "flwr stop $run_id failed"
  deadline=$((SECONDS + 120))
  until [[ $(run_status "$run_id") == finished:* ]]; do
    [ $SECONDS -lt $deadline ] || die "the stopped FedSEAL run $run_id did not end in 120 s"
    sleep 1
  done
  say "FedSEAL stopped after round $(grep -c '"round"' "$SSFL_RUNS/seal/metrics.jsonl"); edge containers re-created"
  recreate_edge
  nodes_online >/dev/null
  submit seal "$SEAL_SETS" "$SEAL_EXP" resume=true
  wait "$sim" || exit 1
  "$PY" - "$SSFL_RUNS/seal/results.json" "$WORK/sim-seal/results.json" <<'EOF'
import json
import sys

resumed, straight = (json.load(open(path))["rounds"] for path in sys.argv[1:])
assert [r["round"] for r in resumed] == [r["round"] for r in straight] == [1, 2, 3], "rounds"
for r, s in zip(resumed, straight):
    assert r["clients"] == 2 and r["failures"] == 0, f"round {r['round']}: {r}"
    for key in ("test_accuracy", "test_loss"):
        assert round(r[key], 4) == round(s[key], 4), f"round {r['round']} {key}: {r[key]} != {s[key]}"
print(
    "compose-e2e: FedSEAL resumed on re-created edge containers: test accuracy "
    + ", ".join(f"{r['test_accuracy']:.4f}" for r in resumed)
    + " (uninterrupted simulation: "
    + ", ".join(f"{s['test_accuracy']:.4f}" for s in straight)
    + ")"
)
EOF
}
step "FedSEAL: edge re-created, resumed" seal_resumed

step "teardown" teardown
say "$(printf '%-34s %6.1f s' "total" "$(echo "$(date +%s.%N) - $TOTAL" | bc)")"
