#!/usr/bin/env bash
# Start rollout servers for `rollout.backend: server`: N `vllm serve` processes with the flags the
# trainer needs, then wait until every one answers and print the config override that names them.
#
#   scripts/vllm_serve.sh MODEL [NUM_SERVERS] [-- EXTRA VLLM SERVE ARGS]
#
#   MODEL        a folder written with save_pretrained (e.g. a checkpoint's model/) or a hub id
#   NUM_SERVERS  default 1; on GPUs server i gets GPUS_PER_SERVER GPUs of CUDA_VISIBLE_DEVICES
#
# Environment: PORT (first port, default 8000; server i listens on PORT+i), HOST (default
# 127.0.0.1; the weight endpoints below must only be reachable by the trainer: bind to a private
# interface, never a public one), NAME (served model name, default policy), PYTHON (default
# python3), DEVICE (cuda or cpu, default cuda when nvidia-smi works), GPUS_PER_SERVER (default 1,
# the tensor-parallel size), WEIGHT_TRANSFER (GPUs: nccl), KV_CACHE_BYTES (CPU, default 256 MiB),
# LOG_DIR (default ./vllm-serve-logs), VLLM_API_KEY (optional; the trainer reads the same variable;
# it guards only the /v1 routes, not the weight endpoints: keep HOST private).
#
# Flags and why:
#   VLLM_SERVER_DEV_MODE=1       the endpoints the trainer pushes weights through: /collective_rpc
#                                (reload_weights), /pause, /resume, /reset_prefix_cache,
#                                /update_weight_version, /weight_info
#   --logprobs-mode raw_logprobs logprobs of the raw logits (before temperature/top-p), the
#                                quantity every corrgrpo policy reports and the trainer compares
#   --generation-config vllm     no sampling defaults from the model's generation_config.json
#   --enable-prefix-caching      a group's G requests share one prompt: its KV blocks are computed
#                                once (vLLM's default on most builds, stated so that none differs;
#                                -- --no-enable-prefix-caching turns it off)
#   --weight-transfer-config     with WEIGHT_TRANSFER=nccl (GPUs): also vLLM's NCCL weight transfer
#                                (/init_weight_transfer_engine, /update_weights), see docs/trainer.md
#   --enforce-eager, --kv-cache-memory-bytes  on CPU: no graph capture, a small explicit KV cache
#                                (override after --, e.g. -- --kv-cache-memory-bytes 4294967296)
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,30p' "$0"
    exit 2
fi
MODEL="$1"; shift
NUM=1
if [[ $# -gt 0 && "$1" != "--" ]]; then NUM="$1"; shift; fi
[[ $# -gt 0 && "$1" == "--" ]] && shift
EXTRA=("$@")

PORT="${PORT:-8000}"
HOST="${HOST:-127.0.0.1}"
NAME="${NAME:-policy}"
PYTHON="${PYTHON:-python3}"
GPUS_PER_SERVER="${GPUS_PER_SERVER:-1}"
LOG_DIR="${LOG_DIR:-vllm-serve-logs}"
if [[ -z "${DEVICE:-}" ]]; then
    if nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
mkdir -p "$LOG_DIR"

COMMON=(--served-model-name "$NAME" --host "$HOST" --logprobs-mode raw_logprobs --generation-config vllm
        --enable-prefix-caching)
if [[ "$DEVICE" == cpu ]]; then
    COMMON+=(--dtype float32 --enforce-eager --kv-cache-memory-bytes "${KV_CACHE_BYTES:-268435456}")
else
    COMMON+=(--tensor-parallel-size "$GPUS_PER_SERVER")
    if [[ -n "${WEIGHT_TRANSFER:-}" ]]; then
        COMMON+=(--weight-transfer-config "{\"backend\": \"$WEIGHT_TRANSFER\"}")
    fi
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        IFS=, read -r -a GPUS <<<"$CUDA_VISIBLE_DEVICES"
    else
        mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader)
    fi
    if (( NUM * GPUS_PER_SERVER > ${#GPUS[@]} )); then
        echo "vllm_serve.sh: $NUM servers x $GPUS_PER_SERVER GPUs need more than the ${#GPUS[@]} GPUs here" >&2
        exit 2
    fi
fi

PIDS=()
stop() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait || true; }
trap stop EXIT
trap 'exit 143' TERM INT

URLS=()
for ((i = 0; i < NUM; i++)); do
    port=$((PORT + i))
    env_vars=(VLLM_SERVER_DEV_MODE=1)
    if [[ "$DEVICE" != cpu ]]; then
        devices=$(IFS=,; echo "${GPUS[*]:$((i * GPUS_PER_SERVER)):$GPUS_PER_SERVER}")
        env_vars+=(CUDA_VISIBLE_DEVICES="$devices")
    fi
    env "${env_vars[@]}" "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
        --port "$port" "${COMMON[@]}" "${EXTRA[@]}" >"$LOG_DIR/server-$i.log" 2>&1 &
    PIDS+=($!)
    URLS+=("http://$HOST:$port/v1")
    echo "server $i: pid $! on port $port, log $LOG_DIR/server-$i.log"
done

for ((i = 0; i < NUM; i++)); do
    until "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://$HOST:$((PORT + i))/health" 2>/dev/null; do
        if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
            echo "vllm_serve.sh: server $i exited; see $LOG_DIR/server-$i.log" >&2
            exit 1
        fi
        sleep 2
    done
done
echo "ready: rollout.backend=server rollout.server.urls=[$(IFS=,; echo "${URLS[*]}")]"
wait -n "${PIDS[@]}" || true
echo "vllm_serve.sh: a server exited; stopping the others" >&2
exit 1
