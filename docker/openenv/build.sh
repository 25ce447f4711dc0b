#!/usr/bin/env bash
# Build the OpenEnv server image of one corrgrpo env, offline from corrgrpo/python:bookworm.
#
#   bash docker/openenv/build.sh ENV_ID TAG ["key=value ..."]
#   bash docker/openenv/build.sh corrgrpo/Code-v0 corrgrpo-openenv-code "split=all dataset=humaneval"
#
# The base image has no pip: docker/openenv/site.sh installs the server's packages with the
# host's pip into docker/openenv/site/, which the Dockerfile copies.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENV_ID="${1:?usage: build.sh ENV_ID TAG [ENV_ARGS]}"
TAG="${2:?usage: build.sh ENV_ID TAG [ENV_ARGS]}"
ENV_ARGS="${3:-split=all}"
bash docker/openenv/site.sh
docker build -q -f docker/openenv/Dockerfile --build-arg ENV_ID="$ENV_ID" --build-arg ENV_ARGS="$ENV_ARGS" -t "$TAG" .
