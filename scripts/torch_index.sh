#!/usr/bin/env bash
# The pip options that choose which build of torch scripts/setup.sh installs, one per line
# (none: the default index's build, which on Linux is the CUDA one, 2+ GB with its nvidia
# packages). Notes go to stderr.
#
#   TORCH_VARIANT=auto (default)  the CPU build unless `nvidia-smi -L` finds an NVIDIA GPU
#   TORCH_VARIANT=cpu | cuda      that build, whatever the machine has
#   TORCH_INDEX=URL               the index the chosen build comes from (default for cpu:
#                                 https://download.pytorch.org/whl/cpu; for cuda: the default
#                                 index), e.g. https://download.pytorch.org/whl/cu128 with cuda
#
# The index is an extra one (--extra-index-url), so the default index and any mirror configured
# for pip still serve torch's own dependencies; torch==X from both indexes resolves to the
# extra index's X+cpu (a local version label sorts above the plain version). An index that does
# not answer within 5 s (no internet, only a local mirror) is left out with a note, and torch
# comes from the default index.
set -euo pipefail

CPU_INDEX=https://download.pytorch.org/whl/cpu
variant="${TORCH_VARIANT:-auto}"
case "$variant" in
  auto)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      variant=cuda
    else
      variant=cpu
    fi ;;
  cpu | cuda) ;;
  *) echo "error: TORCH_VARIANT=$variant: expected auto, cpu or cuda" >&2; exit 2 ;;
esac

index="${TORCH_INDEX:-}"
if [ -z "$index" ] && [ "$variant" = cpu ]; then
  index="$CPU_INDEX"
fi
if [ -z "$index" ]; then
  echo "torch: the $variant build from the default index" >&2
  exit 0
fi

# reachable: a file:// index exists, an http(s) one answers for torch's page within 5 s
if "${PYTHON:-python3}" - "$index" <<'PY'
import os, sys, urllib.parse, urllib.request

url = sys.argv[1].rstrip("/")
if url.startswith("file:"):
    sys.exit(0 if os.path.isdir(urllib.request.url2pathname(urllib.parse.urlparse(url).path)) else 1)
try:
    urllib.request.urlopen(url + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
PY
then
  echo "torch: the $variant build from $index" >&2
  printf '%s\n' --extra-index-url "$index"
else
  echo "torch: $index does not answer: the default index's build instead (on Linux the CUDA one;" \
       "set TORCH_INDEX to a mirror of it to get the $variant build)" >&2
fi
