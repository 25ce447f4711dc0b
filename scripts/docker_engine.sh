#!/usr/bin/env bash
# A Docker engine and the sandbox's local python image, offline.
#
#   bash scripts/docker_engine.sh            # engine + image corrgrpo/python:bookworm
#   CORRGRPO_DOCKER_IMAGE=name:tag bash scripts/docker_engine.sh
#
# 1. installs Debian's docker.io when no dockerd is installed (apt-get),
# 2. starts dockerd in the background when no engine answers, and waits for it,
# 3. builds the image from Debian packages with debootstrap (minbase + python3; no
#    registry needed), unless it is already there.
# Exits non-zero with the reason on stderr when a step fails.
set -euo pipefail

IMAGE="${CORRGRPO_DOCKER_IMAGE:-corrgrpo/python:bookworm}"
SUITE="${CORRGRPO_DOCKER_SUITE:-bookworm}"
LOG="${CORRGRPO_DOCKERD_LOG:-/var/log/corrgrpo-dockerd.log}"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

say() { echo "docker_engine: $*" >&2; }

apt_install() {
  command -v apt-get >/dev/null 2>&1 || { say "no apt-get: install $* yourself"; return 1; }
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

engine_answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# 1. The engine binaries.
if ! command -v dockerd >/dev/null 2>&1; then
  say "installing docker.io"
  apt_install docker.io
fi

# 2. A running engine.
if ! engine_answers; then
  say "starting dockerd (log: $LOG)"
  # setsid + nohup: the engine outlives this script and its terminal.
  $SUDO setsid nohup dockerd >"$LOG" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    engine_answers && break
    sleep 1
  done
  engine_answers || { say "dockerd did not answer within 120 s; see $LOG"; tail -n 20 "$LOG" >&2 || true; exit 1; }
fi
say "engine $(docker version --format '{{.Server.Version}}')"

# 3. The image (cached: built once).
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE present"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
MIRROR="${CORRGRPO_DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ]; then
  # The mirror apt already uses (deb822 .sources or a classic sources.list).
  MIRROR="$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' \
            | grep -v security | head -n 1 || true)"
  [ -n "$MIRROR" ] || MIRROR="$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' \
            | grep -v security | head -n 1 || true)"
  [ -n "$MIRROR" ] || MIRROR="http://deb.debian.org/debian"
fi
ROOTFS="$(mktemp -d /var/tmp/corrgrpo-rootfs.XXXXXX)"
trap '$SUDO rm -rf "$ROOTFS"' EXIT
say "building $IMAGE from $SUITE ($MIRROR)"
$SUDO debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
$SUDO tar -C "$ROOTFS" -c . | docker import -c 'CMD ["python3"]' - "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" python3 -c 'import sys; print("image python", sys.version.split()[0])' >&2
say "image $IMAGE built"
