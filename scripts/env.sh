# Sourced by the scripts: set up (if needed), activate .venv, find the shared data.
bash scripts/setup.sh
. .venv/bin/activate
if [ -z "${SSFL_DATA_DIR:-}" ] && [ -d ../shared/data/fashion-mnist ]; then
  SSFL_DATA_DIR="$(cd ../shared/data && pwd)"
  export SSFL_DATA_DIR
fi
