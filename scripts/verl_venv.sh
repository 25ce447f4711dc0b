#!/usr/bin/env bash
# Build a separate virtual environment with verl, used by tests/test_verl_integration.py to run
# our estimators through verl's own compute_advantage and our envs through its reward loop.
#
#   scripts/verl_venv.sh [VENV_DIR]        # default: .venv-verl in the repository root
#
# torch is installed first, the same CPU build as the main venv, so that no CUDA wheel is pulled.
# verl goes in without its dependencies (its extras pull vLLM/SGLang, flash-attn and CUDA torch);
# then only the packages that the parts we test import (verl's DataProto, compute_advantage,
# metrics and reward loop worker), pinned; then this project, also without its dependencies,
# plus the few that its envs need.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-verl}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install torch==2.13.0 numpy==2.4.6
"${PIP[@]}" install --no-deps verl==0.9.1
# what those verl modules and verl's trainer entry point (python -m verl.trainer.main_ppo: hydra,
# which needs omegaconf<2.4) import, at versions inside verl's own bounds (tensordict<=0.10.0,
# transformers<5.11); torch==2.13.0 is repeated so that no package can replace it
"${PIP[@]}" install torch==2.13.0 hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 pylatexenc==2.10 \
  packaging==25.0 omegaconf==2.3.0 tensordict==0.10.0 transformers==5.10.4 ray==2.60.0 \
  torchdata==0.11.0 codetiming==1.4.0 orjson==3.13.0 datasets==5.2.0 pillow==13.0.0 \
  peft==0.21.2 cachetools==8.0.2 uvicorn==0.55.0 fastapi==0.165.0 aiohttp==3.14.5
# this project (its verl.plugins entry point registers our estimators on `import verl`)
"${PIP[@]}" install --no-deps -e "$ROOT"
"${PIP[@]}" install torch==2.13.0 gymnasium==1.4.0 pyyaml rich httpx pytest pytest-timeout
echo "verl venv ready: $VENV"
"$VENV/bin/python" -W ignore -c "import verl, torch; from verl.trainer.ppo import core_algos as c; \
print('verl', verl.__version__, 'torch', torch.__version__, 'corrgrpo in verl:', 'corrgrpo' in c.ADV_ESTIMATOR_REGISTRY)"
