#!/usr/bin/env bash
# Build a separate virtual environment with Hugging Face TRL and this project (without its own
# dependencies: TRL pins its transformers and accelerate), for the TRL tests
# (tests/test_trl_adapter.py, tests/test_trl_estimators.py run their TRL part in it), bench/vs_trl.py
# and bench/trl_estimators.py.
#
#   scripts/trl_venv.sh [VENV_DIR]        # default: .venv-trl in the repository root
#   .venv/bin/python -m bench.vs_trl      # finds .venv-trl/bin/python by itself
#
# torch is installed first and pinned to the same CPU build as the main venv, so that TRL's
# torch requirement is already satisfied and no CUDA wheels are pulled.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-trl}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install trl==1.16.0 torch==2.13.0
# this project, editable and without its dependencies; what its TRL code and tests import besides
"${PIP[@]}" install --no-deps -e "$ROOT"
"${PIP[@]}" install "gymnasium>=1.0" pytest pytest-timeout pyyaml matplotlib torch==2.13.0
# the openenv extra's packages (read from pyproject.toml) and OpenEnv itself without its gradio
# web UI, for TRL's environment_factory over a served env (tests/test_trl_openenv.py)
"$VENV/bin/python" - "$ROOT/pyproject.toml" > "$VENV/openenv-extra.txt" <<'PY'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["openenv"]))
PY
"${PIP[@]}" install -r "$VENV/openenv-extra.txt" torch==2.13.0
"${PIP[@]}" install --no-deps openenv==0.10.0
echo "TRL venv ready: $VENV"
"$VENV/bin/python" -c "import trl, torch, transformers, corrgrpo.trainer.integrations.trl; print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
