#!/usr/bin/env bash
# Build a separate virtual environment with BFCL's own checker (bfcl-eval), used by
# tests/test_bfcl_agreement.py to compare the tool-call env's BFCL verdicts with BFCL's.
#
#   scripts/bfcl_venv.sh [VENV_DIR]        # default: .venv-bfcl in the repository root
#
# bfcl-eval is installed without its dependencies: they are some 150 packages (vendor SDKs
# for OpenAI, Anthropic, Cohere, Mistral, Google, AWS, Writer, and CUDA torch through
# sentence-transformers), none of which the AST checker uses. The checker's own imports are
# the standard library and bfcl_eval itself, except one table of model settings that imports
# every model handler; tests/bfcl_reference_checker.py stands in for that table. The wheel
# already downloaded for the BFCL data (.cache/bfcl, see scripts/test.sh) is used when present.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-bfcl}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
WHEELS="${BFCL_WHEEL_DIR:-$ROOT/.cache/bfcl}"

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
FIND=()
[ -d "$WHEELS" ] && FIND=(--find-links "$WHEELS")
"${PIP[@]}" install -q --no-deps "${FIND[@]}" bfcl-eval==2026.3.23
echo "BFCL venv ready: $VENV"
"$VENV/bin/python" "$ROOT/tests/bfcl_reference_checker.py" --version
