# Sourced by setup.sh and wheelhouse.sh: the interpreter and the torch build the project pins
# (torchvision 0.28 matches torch 2.13; CPU wheels from PyTorch's CPU index).
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
