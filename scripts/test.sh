#!/usr/bin/env bash
# Set up the virtual environment (CPU torch first, so no CUDA build is downloaded),
# lint, and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,agentdojo]"
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
