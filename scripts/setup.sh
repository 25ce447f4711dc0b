#!/usr/bin/env bash
# Create .venv with the CPU build of torch and the project (extras: EXTRAS=..., default dev,code).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[${EXTRAS:-dev,code}]"
