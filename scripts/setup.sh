#!/usr/bin/env bash
# Create .venv and install ssfl with its test tools, with an explicitly chosen torch build.
#
#   bash scripts/setup.sh                  online; torch build from SSFL_TORCH, else by machine
#   bash scripts/setup.sh --offline DIR    from a wheelhouse made by scripts/wheelhouse.sh
#   bash scripts/setup.sh --print-choice   print the torch build it would install; install nothing
#
# SSFL_TORCH=cpu|cuda|system forces the build (default: cuda where `nvidia-smi -L` lists a
# GPU, else cpu; offline: the wheelhouse's build). cpu: the CPU wheels (pip's own sources
# when they already hold the pinned +cpu build, else SSFL_TORCH_INDEX, default PyTorch's CPU
# index); cuda: the CUDA build PyPI serves (SSFL_TORCH_INDEX adds another index, e.g. one of
# PyTorch's cuXXX ones); system: a venv with --system-site-packages that reuses the torch
# and torchvision the interpreter already has (e.g. a cluster image) and installs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pins.sh

die() {
  echo "setup.sh: $1" >&2
  exit "${2:-2}"
}

# The build to install: SSFL_TORCH, else the wheelhouse's (offline), else by nvidia-smi.
torch_choice() {
  local wheelhouse=$1
  if [ -n "${SSFL_TORCH:-}" ]; then
    case "$SSFL_TORCH" in
      cpu | cuda | system) echo "$SSFL_TORCH" ;;
      *) die "SSFL_TORCH=$SSFL_TORCH: expected cpu, cuda or system" ;;
    esac
  elif [ -n "$wheelhouse" ] && [ -f "$wheelhouse/ssfl-torch.txt" ]; then
    case "$(cat "$wheelhouse/ssfl-torch.txt")" in
      none) echo system ;;
      *) cat "$wheelhouse/ssfl-torch.txt" ;;
    esac
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo cuda
  else
    echo cpu
  fi
}

OFFLINE=""
PRINT_CHOICE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --offline)
      [ $# -ge 2 ] || die "--offline needs the wheelhouse folder, e.g. --offline wheels/"
      [ -d "$2" ] || die "--offline $2: no such folder"
      OFFLINE=$(cd "$2" && pwd)
      shift 2
      ;;
    --print-choice) PRINT_CHOICE=1; shift ;;
    *) die "unknown argument '$1' (expected --offline DIR or --print-choice)" ;;
  esac
done

CHOICE=$(torch_choice "$OFFLINE")
if [ "$PRINT_CHOICE" = 1 ]; then
  echo "$CHOICE"
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  if [ "$CHOICE" = system ]; then
    "$PYTHON" -m venv --system-site-packages .venv
  else
    "$PYTHON" -m venv .venv
  fi
fi
if [ "$CHOICE" = system ]; then
  .venv/bin/python -c "import torch, torchvision" 2>/dev/null ||
    die "SSFL_TORCH=system: .venv cannot import torch and torchvision; install them for $PYTHON (a fresh .venv sees its packages) or use SSFL_TORCH=cpu|cuda"
fi
. .venv/bin/activate

PIP=(python -m pip install -q)
if [ -n "$OFFLINE" ]; then
  PIP+=(--no-index --find-links "$OFFLINE")
fi

# Whether pip's own sources (e.g. a configured find-links) hold the pinned CPU build.
has_local_cpu_torch() {
  python -m pip install -q --dry-run --no-index --no-deps --ignore-installed \
    "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1
}

"${PIP[@]}" --upgrade pip
case "$CHOICE" in
  cpu)
    if [ -n "$OFFLINE" ] || has_local_cpu_torch; then
      "${PIP[@]}" "torch==$TORCH_VERSION+cpu" "torchvision==$TORCHVISION_VERSION"
    else
      "${PIP[@]}" --extra-index-url "${SSFL_TORCH_INDEX:-$CPU_INDEX}" \
        "torch==$TORCH_VERSION+cpu" "torchvision==$TORCHVISION_VERSION"
    fi
    "${PIP[@]}" -e ".[test]"
    ;;
  cuda)
    "${PIP[@]}" ${SSFL_TORCH_INDEX:+--extra-index-url "$SSFL_TORCH_INDEX"} \
      "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    python -c "import sys, torch; sys.exit(torch.version.cuda is None)" ||
      die "SSFL_TORCH=cuda: .venv holds a CPU build of torch; remove .venv, or set SSFL_TORCH_INDEX to a CUDA index" 1
    "${PIP[@]}" -e ".[test]"
    ;;
  system)
    # Pin the interpreter's own torch and torchvision, so pip fails rather than replace them.
    python -c "import torch, torchvision; print(f'torch=={torch.__version__}\ntorchvision=={torchvision.__version__}')" >.venv/system-torch.txt
    "${PIP[@]}" --constraint .venv/system-torch.txt -e ".[test]"
    ;;
esac
python -c "import torch; print(f'setup.sh: torch {torch.__version__} ($CHOICE), CUDA {torch.version.cuda}')"
