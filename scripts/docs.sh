#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml: docs/ with README.md as its home page) into OUT in
# strict mode: any warning (a missing page or file, a broken anchor, a page left out of the
# nav) fails the build with a non-zero exit.
#   bash scripts/docs.sh OUT      e.g. bash scripts/docs.sh site, then open site/index.html
# Uses .venv (made by scripts/setup.sh when absent) and installs the `docs` extra's pinned
# MkDocs and Material into it when they are missing.
set -euo pipefail
[ $# = 1 ] || { echo "docs.sh: expected one argument, the output folder (e.g. bash scripts/docs.sh site)" >&2; exit 2; }
OUT=$(realpath -m -- "$1")
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
. .venv/bin/activate
python -c "import mkdocs, material" 2>/dev/null || python -m pip install -q -e ".[docs]"
python -m mkdocs build --strict --clean --site-dir "$OUT"
