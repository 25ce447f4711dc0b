#!/usr/bin/env bash
# Create .venv with torch and the project (extras: EXTRAS=..., default dev,code). torch is the
# CPU build on a machine without an NVIDIA GPU, the CUDA build with one; TORCH_VARIANT=cpu|cuda
# or TORCH_INDEX=URL choose otherwise (scripts/torch_index.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
torch_args=$(PYTHON=.venv/bin/python bash scripts/torch_index.sh)  # a bad TORCH_VARIANT stops here
# shellcheck disable=SC2086  # the options, one word each (none: the default index)
.venv/bin/python -m pip install -q $torch_args torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[${EXTRAS:-dev,code}]"
