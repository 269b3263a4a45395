#!/usr/bin/env bash
# Download every wheel ssfl needs (the whole dependency closure, test tools and the build
# backend included) into DIR, on a connected machine, for another machine's Python and
# platform; `bash scripts/setup.sh --offline DIR` then installs from DIR without a network.
#
#   bash scripts/wheelhouse.sh DIR [--python-version 3.12]
#       [--platform manylinux_2_28_x86_64|manylinux_2_28_aarch64] [--torch cpu|cuda|none]
#       [--for dev|image]
#
# Defaults: this interpreter's Python version, manylinux_2_28 of this machine's architecture,
# the cuda build, dev. cpu takes the +cpu wheels (pip's own sources when they hold the pinned
# build, else SSFL_TORCH_INDEX, default PyTorch's CPU index); cuda the CUDA build PyPI serves
# (SSFL_TORCH_INDEX adds an index); none leaves torch and torchvision out (the target reuses
# its own: SSFL_TORCH=system). DIR/ssfl-torch.txt records the build, which setup.sh --offline
# installs. --for image: only what the container image runs (docker/Dockerfile): Flower
# without its simulation engine (no Ray), no test tools; DIR/requirements.txt lists them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pins.sh

die() {
  echo "wheelhouse.sh: $1" >&2
  exit 2
}

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || die "usage: wheelhouse.sh DIR [--python-version X.Y] [--platform TAG] [--torch cpu|cuda|none] [--for dev|image]"
DIR=$1
shift
PY_VERSION=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PLATFORM="manylinux_2_28_$(uname -m)"
TORCH=cuda
FOR=dev
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --python-version) PY_VERSION=$2 ;;
    --platform) PLATFORM=$2 ;;
    --torch) TORCH=$2 ;;
    --for) FOR=$2 ;;
    *) die "unknown option '$1' (expected --python-version, --platform, --torch or --for)" ;;
  esac
  shift 2
done
[[ "$PY_VERSION" =~ ^3\.[0-9]+$ ]] || die "--python-version $PY_VERSION: expected e.g. 3.12"
case "$PLATFORM" in
  manylinux_2_28_x86_64 | manylinux_2_28_aarch64) ;;
  *) die "--platform $PLATFORM: expected manylinux_2_28_x86_64 or manylinux_2_28_aarch64" ;;
esac
case "$TORCH" in
  cpu) TORCH_REQS=("torch==$TORCH_VERSION+cpu" "torchvision==$TORCHVISION_VERSION") ;;
  cuda) TORCH_REQS=("torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION") ;;
  none) TORCH_REQS=() ;;
  *) die "--torch $TORCH: expected cpu, cuda or none" ;;
esac
case "$FOR" in
  dev | image) ;;
  *) die "--for $FOR: expected dev or image" ;;
esac

# dev: pyproject.toml's dependencies and test extra, less torch and torchvision (pinned
# above), plus what installing from DIR needs: pip and the build backend of the editable
# install. image: the dependencies only, Flower without its simulation extra.
mapfile -t PROJECT_REQS < <(FOR=$FOR "$PYTHON" - <<'EOF'
import os
import re
import sys

try:
    import tomllib
except ImportError:
    sys.exit("wheelhouse.sh: reading pyproject.toml needs Python >= 3.11 (set PYTHON)")
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
image = os.environ["FOR"] == "image"
reqs = project["dependencies"] + ([] if image else project["optional-dependencies"]["test"])
for req in reqs:
    if re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0] not in ("torch", "torchvision"):
        print(req.replace("flwr[simulation]", "flwr") if image else req)
if not image:
    for req in ("pip", "hatchling", "editables"):
        print(req)
EOF
)

# Whether pip's own sources (e.g. a configured find-links) hold the pinned CPU build.
has_local_cpu_torch() {
  "$PYTHON" -m pip install -q --dry-run --no-index --no-deps --ignore-installed --target "$DIR" \
    --only-binary=:all: --python-version "$PY_VERSION" --platform "$PLATFORM" \
    "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1
}

INDEX=()
if [ "$TORCH" = cpu ] && [ -n "${SSFL_TORCH_INDEX-$CPU_INDEX}" ] && ! has_local_cpu_torch; then
  INDEX=(--extra-index-url "${SSFL_TORCH_INDEX-$CPU_INDEX}")
elif [ "$TORCH" = cuda ] && [ -n "${SSFL_TORCH_INDEX:-}" ]; then
  INDEX=(--extra-index-url "$SSFL_TORCH_INDEX")
fi

# pip takes a --platform tag literally: a manylinux_2_28 machine also runs the older glibc tags.
ARCH=${PLATFORM#manylinux_2_28_}
PLATFORMS=()
for glibc in $(seq 28 -1 5); do
  PLATFORMS+=(--platform "manylinux_2_${glibc}_$ARCH")
done
for legacy in manylinux2014 manylinux2010 manylinux1; do
  PLATFORMS+=(--platform "${legacy}_$ARCH")
done

mkdir -p "$DIR"
"$PYTHON" -m pip download -q --dest "$DIR" --only-binary=:all: \
  --python-version "$PY_VERSION" "${PLATFORMS[@]}" "${INDEX[@]}" "${TORCH_REQS[@]}" "${PROJECT_REQS[@]}"
echo "$TORCH" >"$DIR/ssfl-torch.txt"
if [ "$FOR" = image ]; then
  printf '%s\n' "${TORCH_REQS[@]}" "${PROJECT_REQS[@]}" >"$DIR/requirements.txt"
fi
echo "wheelhouse.sh: $(ls "$DIR"/*.whl | wc -l) wheels for Python $PY_VERSION on $PLATFORM (torch: $TORCH) in $DIR"
