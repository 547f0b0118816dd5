#!/usr/bin/env bash
# The GPU comparison of benchmarks/RESULTS.md ("GPU (H200)"): one workload (random token-id
# prompts, 256 in / 512 out, ignore_eos), the same seeded arrivals at the same rates, the same
# engine settings everywhere, measured by `vllm-fleet bench` (or its runner, in-process).
#
#   benchmarks/gpu/run.sh single   # (a) AsyncLLM in-process, (b) stock vLLM OpenAI server,
#                                  # (c) our worker over gRPC, (d) our worker + gateway; one GPU each
#                                  # at a time; with two GPUs, (b)‖(c) then (a)‖(d) run side by side
#                                  # (PART=1: only (b)‖(c); PART=2: only (a)‖(d), to fit a call's limit;
#                                  #  PART=bd: (b)‖(d), the gateway beside the stock server)
#   benchmarks/gpu/run.sh pair     # two GPUs: 2 workers + gateway vs 2 stock servers + nginx
#   benchmarks/gpu/run.sh tp2      # two GPUs: one stock server with tensor parallel 2
#   benchmarks/gpu/run.sh short    # issue #17 target 2 on ONE GPU: many short requests (Qwen3-0.6B
#                                  # shape, 256 in / 16 out) to the stock server, our gateway + worker
#                                  # and (when $SMG_SITE holds it) SMG + vLLM's gRPC server; all started first,
#                                  # each at SHORT_MEM of the GPU, then benched in turn, ROUNDS times
#                                  # (SHORT_* variables change the model, shape and systems: see short())
#   benchmarks/gpu/run.sh scale    # issue #17 target 4: gateway --processes 1, 2, 4 on this host's
#                                  # CPUs with mock workers (no GPU)
#   benchmarks/gpu/run.sh mock     # our stack on the mock engine (checks the staging, no GPU)
#   benchmarks/gpu/run.sh smoke    # tiny version of `single` (any machine, e.g. CPU + SmolLM2)
#
# Needs vLLM importable by $VLLM_PY and our package by $FLEET_PY (stage.sh sets both up on the
# GPU machine); MODEL is a model folder (make_model.py builds the Qwen3.5-9B-shaped one).
# Reports go to $RESULTS/<system>.json|.md; server logs to $RESULTS/logs.
set -uo pipefail
cd "$(dirname "$0")/../.."

PHASE=${1:?usage: run.sh single|pair|tp2|short|grid|scale|mock|smoke}
VLLM_PY=${VLLM_PY:-python3}
FLEET_PY=${FLEET_PY:-python3}
MODEL=${MODEL:?set MODEL to a model folder}
NAME=${NAME:-qwen3.5-9b}
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/gpu-results}
RATES=${RATES:-4,8,16,inf}
NUM=${NUM:-192}                      # measured requests per rate (inf: all at once)
INF_NUM=${INF_NUM:-512}
IN_LEN=${IN_LEN:-256}
OUT_LEN=${OUT_LEN:-512}
WARMUP=${WARMUP:-8}
PROMPT_FORMAT=${PROMPT_FORMAT:-tokens}        # token ids everywhere: the stand-in tokenizer cannot encode words
DRAIN=${DRAIN:-120}
SLO=${SLO:-ttft=800ms,tpot=50ms}           # goodput: the reference deployment's P99 TTFT bound
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
BASE=${BASE:-18500}
# Engine settings shared by every system: vLLM's offline (LLM class) defaults on an H200, spelled
# out, since its OpenAI server would otherwise halve the step's token budget.
ENGINE_OPTS=${ENGINE_OPTS:---load-format dummy --dtype bfloat16 --max-model-len 4096 --gpu-memory-utilization 0.85 --max-num-seqs 1024 --max-num-batched-tokens 16384 --seed 0}
VLLM_EXTRA=${VLLM_EXTRA:---language-model-only --gdn-prefill-backend triton}
FLEET_EXTRA=${FLEET_EXTRA:---engine-arg language_model_only=true --engine-arg gdn_prefill_backend=triton}
# The same settings for workers that `vllm-fleet node` starts (it takes the plan's own options
# and passes the rest through as engine arguments).
NODE_ENGINE_ARGS=${NODE_ENGINE_ARGS:---engine-arg load_format=dummy --engine-arg dtype=bfloat16 --engine-arg max_num_batched_tokens=16384 --engine-arg seed=0 $FLEET_EXTRA}
START_TIMEOUT=${START_TIMEOUT:-420}

mkdir -p "$RESULTS/logs"
PIDS=()
log() { echo "[gpu $(date -u +%H:%M:%S)] $*" >&2; }

start() {  # start NAME GPU CMD...: own process group and log; GPU "" = all visible
    local name=$1 gpu=$2; shift 2
    if [[ -n $gpu ]]; then
        CUDA_VISIBLE_DEVICES=$gpu setsid "$@" >"$RESULTS/logs/$name.log" 2>&1 &
    else
        setsid "$@" >"$RESULTS/logs/$name.log" 2>&1 &
    fi
    PIDS+=($!)
    log "started $name (pid $!, gpu ${gpu:-all})"
}

stop_all() {
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null
    done
    PIDS=()
}
trap stop_all EXIT

wait_http() {  # wait_http URL SECONDS
    local deadline=$((SECONDS + $2))
    until curl -sf "$1/v1/models" | grep -q '"id"'; do
        ((SECONDS > deadline)) && { log "$1 not ready after $2 s"; return 1; }
        sleep 2
    done
    log "$1 ready after $((SECONDS - deadline + $2)) s"
}

wait_grpc() {  # wait_grpc SECONDS host:port...
    local seconds=$1; shift
    $FLEET_PY - "$seconds" "$@" <<'PYEOF'
import asyncio, sys
from vllm_fleet.client import WorkerClient
async def main():
    for address in sys.argv[2:]:
        client = WorkerClient(address)
        await client.wait_serving(timeout=float(sys.argv[1]))
        await client.close()
asyncio.run(main())
PYEOF
}

children_cpu() {  # CPU seconds (user + system) of this shell's finished children so far
    # `times` must run in this shell itself (not a pipe or $(...), which would be a new process).
    times >"$RESULTS/logs/.times.$BASHPID"
    awk 'NR==2 { n=0; for (i=1; i<=2; i++) { split($i, p, /[ms]/); n += p[1]*60 + p[2] }; print n }' \
        "$RESULTS/logs/.times.$BASHPID"
}

client_cpu() {  # client_cpu LABEL PART BEFORE_S: the bench's own CPU seconds for this part
    local now; children_cpu >"$RESULTS/logs/.cpu.$BASHPID"; now=$(<"$RESULTS/logs/.cpu.$BASHPID")
    echo "$2: bench client used $(awk -v a="$now" -v b="$3" 'BEGIN { printf "%.1f", a - b }') CPU-seconds" \
        >>"$RESULTS/logs/client-cpu-$1.txt"
}

cpu_snapshot() {  # cumulative CPU seconds of every process: pid, seconds, command
    ps -eo pid=,times=,args= | awk '{pid=$1; t=$2; $1=""; $2=""; print pid, t, substr($0, 3, 110)}'
}

cpu_report() {  # cpu_report LABEL BEFORE AFTER WALL_S: the processes that used CPU during a bench
    awk -v wall="$4" -v label="$1" 'NR==FNR {before[$1]=$2; next}
        { used = $2 - ($1 in before ? before[$1] : 0); if (used >= 1) {
            cmd=$0; sub(/^[0-9]+ [0-9]+ /, "", cmd)
            printf "| %s | %d | %.0f | %.0f%% | %s |\n", label, $1, used, 100 * used / wall, cmd } }' "$2" "$3" \
        >"$RESULTS/cpu-$1.md"
}

bench() {  # bench LABEL TARGET [extra bench options]: finite rates, then inf with INF_NUM requests
    local label=$1 target=$2; shift 2
    local cpu_before=$RESULTS/logs/ps-before-$label started=$SECONDS client_before
    cpu_snapshot >"$cpu_before"
    children_cpu >"$RESULTS/logs/.cpu.$BASHPID"; client_before=$(<"$RESULTS/logs/.cpu.$BASHPID")
    local finite=${RATES%,inf}
    finite=${finite#inf}
    log "bench $label: rates ${finite:-none} then inf x $INF_NUM"
    if [[ -n $finite ]]; then
        $FLEET_PY -m vllm_fleet.cli bench --target "$target" --label "$label" --model "$NAME" --workload random \
            --input-len "$IN_LEN" --output-len "$OUT_LEN" --prompt-format "$PROMPT_FORMAT" --rate "$finite" --num-requests "$NUM" \
            --warmup-requests "$WARMUP" --drain-timeout "$DRAIN" --slo "$SLO" --seed 0 --no-progress --output "$RESULTS/$label.json" \
            "$@" >"$RESULTS/logs/bench-$label.log" 2>&1 || log "bench $label (finite rates) failed"
        client_cpu "$label" "finite rates" "$client_before"
        children_cpu >"$RESULTS/logs/.cpu.$BASHPID"; client_before=$(<"$RESULTS/logs/.cpu.$BASHPID")
    fi
    if [[ $RATES == *inf ]]; then
        $FLEET_PY -m vllm_fleet.cli bench --target "$target" --label "$label" --model "$NAME" --workload random \
            --input-len "$IN_LEN" --output-len "$OUT_LEN" --prompt-format "$PROMPT_FORMAT" --rate inf --num-requests "$INF_NUM" \
            --warmup-requests "$WARMUP" --drain-timeout "$DRAIN" --slo "$SLO" --seed 1 --no-progress \
            --output "$RESULTS/$label-inf.json" "$@" >>"$RESULTS/logs/bench-$label.log" 2>&1 || log "bench $label (inf) failed"
        client_cpu "$label" "inf" "$client_before"
    fi
    # The bench's own CPU (it is the client: a saturated client would cap what it measures).
    cpu_snapshot >"$RESULTS/logs/ps-after-$label"
    cpu_report "$label" "$cpu_before" "$RESULTS/logs/ps-after-$label" $((SECONDS - started + 1))
    log "bench $label done"
    export_results
}

export_results() {  # when $OUT is set (the GPU machine's folder that comes back): summary + archive so far
    [[ -n ${OUT:-} ]] || return 0
    local tmp="$OUT/.summary.$BASHPID"
    $FLEET_PY benchmarks/gpu/summarize.py "$RESULTS" --pack "$OUT/results-$PHASE.tar.xz" >"$tmp" 2>&1
    mv "$tmp" "$OUT/summary-$PHASE.md"
}

vllm_server() {  # vllm_server NAME GPU PORT [extra]
    local name=$1 gpu=$2 port=$3; shift 3
    # Its own compile cache by default: it may start beside our worker, and two first compilations
    # must not write one cache folder at once. STOCK_CACHE_ROOT shares one already warm instead.
    start "$name" "$gpu" env VLLM_CACHE_ROOT=${STOCK_CACHE_ROOT:-${TMPDIR:-/tmp}/vllm-cache-$name} $VLLM_PY -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name "$NAME" \
        --host 127.0.0.1 --port "$port" $ENGINE_OPTS $VLLM_EXTRA --disable-uvicorn-access-log "$@"
}

fleet_worker() {  # fleet_worker NAME GPU PORT
    start "$1" "$2" $FLEET_PY -m vllm_fleet.cli worker --engine vllm --model "$MODEL" --served-model-name "$NAME" \
        --port "$3" --device "GPU $2" $ENGINE_OPTS $FLEET_EXTRA
}

gateway() {  # gateway PORT WORKERS [extra]
    local port=$1 workers=$2; shift 2
    start "gateway-$port" "" $FLEET_PY -m vllm_fleet.cli gateway --workers "$workers" --port "$port" --no-access-log "$@"
}

inprocess() {  # inprocess LABEL GPU: (a), the bench's runner around AsyncLLM in this process
    local label=$1 gpu=$2
    log "in-process $label on GPU $gpu"
    local common=(--model "$MODEL" $ENGINE_OPTS $FLEET_EXTRA --bench-workload random --bench-input-len "$IN_LEN"
                  --bench-output-len "$OUT_LEN" --bench-prompt-format tokens --bench-warmup-requests "$WARMUP"
                  --bench-drain-timeout "$DRAIN" --bench-slo "$SLO" --no-bench-progress --bench-label "$label")
    local rates=(--bench-rate "${RATES%,inf}" --bench-num-requests "$NUM" --bench-seed 0 --bench-output "$RESULTS/$label.json")
    [[ $RATES == *inf ]] && rates+=(--inf-num-requests "$INF_NUM")
    CUDA_VISIBLE_DEVICES=$gpu $FLEET_PY benchmarks/gpu/inprocess_bench.py "${common[@]}" "${rates[@]}" \
        >"$RESULTS/logs/bench-$label.log" 2>&1 || log "in-process $label failed"
    log "in-process $label done"
    export_results
}

gpu_memory() {  # sample every GPU's memory use every 2 s into $RESULTS/gpu-memory.csv
    nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu --format=csv,noheader -l 2 \
        >>"$RESULTS/gpu-memory.csv" 2>/dev/null &
    PIDS+=($!)
}

placement_check() {  # item 4: NVML discovery and the placement plan on the real card, nothing started
    $FLEET_PY -m vllm_fleet.cli gpus --model "$MODEL" --gpu-memory-utilization 0.85 --max-model-len 4096 \
        --max-num-seqs 1024 >"$RESULTS/gpus.txt" 2>&1 || log "vllm-fleet gpus failed"
    $FLEET_PY -m vllm_fleet.cli node --devices gpu --model "$MODEL" --gpu-memory-utilization 0.85 --max-model-len 4096 \
        --max-num-seqs 1024 --dry-run $NODE_ENGINE_ARGS >"$RESULTS/node-dry-run.txt" 2>&1 || log "node --dry-run failed"
    nvidia-smi -L >"$RESULTS/nvidia-smi-L.txt" 2>&1
    log "placement check: $(head -c 300 "$RESULTS/gpus.txt" | tr '\n' ' ')"
}

single() {
    gpu_memory
    local part=${PART:-all}
    if ((GPUS >= 2)); then
        # (b) stock server on GPU 0 beside (c) our worker on GPU 1; then (a) in-process on GPU 0
        # beside (d) the same worker behind the gateway.
        fleet_worker worker 1 $((BASE + 2))
        if [[ $part == bd ]]; then
            vllm_server vllm-serve 0 $((BASE + 1))
            (wait_http http://127.0.0.1:$((BASE + 1)) "$START_TIMEOUT" && bench b-vllm-serve http://127.0.0.1:$((BASE + 1))) &
            local bench_bd=$!
            if wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 2)); then
                gateway $((BASE + 3)) 127.0.0.1:$((BASE + 2))
                wait_http http://127.0.0.1:$((BASE + 3)) 60 && bench d-gateway-worker http://127.0.0.1:$((BASE + 3))
            fi
            wait $bench_bd
            return
        fi
        if [[ $part != 2 ]]; then
            placement_check
            vllm_server vllm-serve 0 $((BASE + 1)); local server=$!
            (wait_http http://127.0.0.1:$((BASE + 1)) "$START_TIMEOUT" && bench b-vllm-serve http://127.0.0.1:$((BASE + 1))) &
            local bench_b=$!
            if wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 2)); then
                bench c-worker-grpc grpc://127.0.0.1:$((BASE + 2))
                # The same at saturation with one gRPC call per request (the transport before GenerateMany).
                RATES=inf bench c-worker-grpc-percall grpc://127.0.0.1:$((BASE + 2)) --no-multiplex
                # ... and with tokens coalesced over 20 ms (fewer, larger messages).
                [[ ${COALESCED:-0} == 1 ]] && RATES=inf bench c-worker-grpc-20ms grpc://127.0.0.1:$((BASE + 2)) --stream-interval-ms 20
            fi
            wait $bench_b
            kill -TERM -- "-$server" 2>/dev/null
            for _ in $(seq 1 60); do kill -0 "$server" 2>/dev/null || break; sleep 0.5; done
            kill -KILL -- "-$server" 2>/dev/null
            [[ $part == 1 ]] && return
        fi
        local bench_a=""
        if [[ ! -f $RESULTS/a-inprocess-inf.json ]]; then inprocess a-inprocess 0 & bench_a=$!; fi
        if wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 2)); then
            gateway $((BASE + 3)) 127.0.0.1:$((BASE + 2))
            wait_http http://127.0.0.1:$((BASE + 3)) 60 && bench d-gateway-worker http://127.0.0.1:$((BASE + 3))
        fi
        [[ -n $bench_a ]] && wait $bench_a
    else
        vllm_server vllm-serve 0 $((BASE + 1))
        wait_http http://127.0.0.1:$((BASE + 1)) "$START_TIMEOUT" && bench b-vllm-serve http://127.0.0.1:$((BASE + 1))
        stop_all; gpu_memory
        fleet_worker worker 0 $((BASE + 2))
        if wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 2)); then
            bench c-worker-grpc grpc://127.0.0.1:$((BASE + 2))
            gateway $((BASE + 3)) 127.0.0.1:$((BASE + 2))
            wait_http http://127.0.0.1:$((BASE + 3)) 60 && bench d-gateway-worker http://127.0.0.1:$((BASE + 3))
        fi
        stop_all; gpu_memory
        inprocess a-inprocess 0
    fi
    stop_all
}

pair() {  # two GPUs: our fleet in small vs the stock alternatives (PAIR_PART=fleet|nginx: one of them)
    gpu_memory
    if [[ ${PAIR_PART:-all} != nginx ]]; then
        # Our two workers come from `vllm-fleet node`: NVML discovery, the placement plan (checked
        # against the capacity model) and one worker per GPU with its CUDA_VISIBLE_DEVICES.
        start node "" $FLEET_PY -m vllm_fleet.cli node --devices gpu --model "$MODEL" --base-port $((BASE + 11)) \
            --gpu-memory-utilization 0.85 --max-model-len 4096 --max-num-seqs 1024 --startup-timeout-s "$START_TIMEOUT" \
            --log-dir "$RESULTS/logs/node" $NODE_ENGINE_ARGS
        if wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 11)) 127.0.0.1:$((BASE + 12)); then
            gateway $((BASE + 13)) 127.0.0.1:$((BASE + 11)),127.0.0.1:$((BASE + 12)) --policy least_outstanding
            wait_http http://127.0.0.1:$((BASE + 13)) 60 && bench pair-fleet http://127.0.0.1:$((BASE + 13))
        fi
        stop_all
        gpu_memory
    fi
    [[ ${PAIR_PART:-all} == fleet ]] && return
    vllm_server vllm0 0 $((BASE + 14)); vllm_server vllm1 1 $((BASE + 15))
    wait_http http://127.0.0.1:$((BASE + 14)) "$START_TIMEOUT" && wait_http http://127.0.0.1:$((BASE + 15)) "$START_TIMEOUT" &&
        nginx_rr $((BASE + 16)) $((BASE + 14)) $((BASE + 15)) && bench pair-nginx http://127.0.0.1:$((BASE + 16))
    stop_all
}

tp2() {
    gpu_memory
    vllm_server vllm-tp2 "" $((BASE + 21)) --tensor-parallel-size 2
    wait_http http://127.0.0.1:$((BASE + 21)) "$START_TIMEOUT" && bench pair-vllm-tp2 http://127.0.0.1:$((BASE + 21))
    stop_all
}

nginx_rr() {  # nginx_rr PORT UPSTREAM_PORT...: round robin over loopback servers
    local port=$1; shift
    local dir=$RESULTS/nginx upstreams=""
    mkdir -p "$dir"
    for p in "$@"; do upstreams+="server 127.0.0.1:$p; "; done
    cat >"$dir/nginx.conf" <<NGINX
worker_processes 4;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
daemon off;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $dir/body; proxy_temp_path $dir/proxy; fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
    upstream vllm { $upstreams keepalive 256; }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 900s;
        }
    }
}
NGINX
    start nginx "" "${NGINX:-nginx}" -c "$dir/nginx.conf" -p "$dir"
    wait_http http://127.0.0.1:$port 30
}

smg_engine() {  # smg_engine NAME GPU PORT: vLLM's own gRPC server (smg-grpc-servicer), the engine SMG routes to
    local name=$1 gpu=$2 port=$3
    # Its servicer's own warm-up is off: every system gets the same untimed pass (WARMUP) instead.
    start "$name" "$gpu" env VLLM_CACHE_ROOT=${STOCK_CACHE_ROOT:-${TMPDIR:-/tmp}/vllm-cache-$name} \
        SMG_VLLM_SERVICER_WARMUP=${SMG_WARMUP:-off} PYTHONPATH=$SMG_SITE:$FLEET_SITE:$SITE \
        ${SMG_PY:-python3} -m ${SMG_ENGINE_MODULE:-vllm.entrypoints.grpc_server} --model "$MODEL" --served-model-name "$NAME" \
        --host 127.0.0.1 --port "$port" $ENGINE_OPTS $VLLM_EXTRA
}

smg_gateway() {  # smg_gateway PORT ENGINE_PORT: the Rust gateway (it tokenizes, templates, detokenizes)
    start "smg-$1" "" env PYTHONPATH=$SMG_SITE:$FLEET_SITE:$SITE ${SMG_PY:-python3} -m smg launch --host 127.0.0.1 --port "$1" \
        --worker-urls "grpc://127.0.0.1:$2" --model-path "$MODEL" --policy round_robin \
        --prometheus-port $(($1 + 100)) ${SMG_EXTRA:-}
}

short() {  # issue #17 target 2: many short requests; every system up (and done compiling) before any bench
    local frac=${SHORT_MEM:-0.28} api=${API_SERVERS:-1} rounds=${ROUNDS:-2}
    MODEL=${SHORT_MODEL:?set SHORT_MODEL (stage.sh makes the Qwen3-0.6B-shaped folder)} NAME=${SHORT_NAME:-qwen3-0.6b}
    IN_LEN=${SHORT_IN:-256} OUT_LEN=${SHORT_OUT:-16} RATES=${SHORT_RATES:-100,200,400,inf}
    NUM=${SHORT_NUM:-2000} INF_NUM=${SHORT_INF_NUM:-2048} WARMUP=${SHORT_WARMUP:-32}
    # Text prompts: SMG's /v1/completions takes no token ids. The stand-in tokenizer gives each of
    # the bench's words an id of its own, so every system gets the same IN_LEN prompt tokens.
    PROMPT_FORMAT=${SHORT_PROMPT_FORMAT:-text}
    [[ -f $MODEL/tokenizer.json ]] ||
        $FLEET_PY benchmarks/gpu/make_model.py --bench-words "${SHORT_CONFIG:-benchmarks/gpu/configs/qwen3-0.6b}" "$MODEL" >/dev/null
    ENGINE_OPTS=${SHORT_ENGINE_OPTS:-"--load-format dummy --dtype bfloat16 --max-model-len 4096 --gpu-memory-utilization $frac --max-num-seqs 1024 --max-num-batched-tokens 16384 --seed 0"}
    VLLM_EXTRA=${SHORT_VLLM_EXTRA:-} FLEET_EXTRA=${SHORT_FLEET_EXTRA:-}
    # One compile cache, filled by the first engine: the systems start one after another, never at once.
    export STOCK_CACHE_ROOT=${TMPDIR:-/tmp}/vllm-cache-short VLLM_CACHE_ROOT=${TMPDIR:-/tmp}/vllm-cache-short
    gpu_memory
    local systems=() want=" ${SHORT_SYSTEMS:-stock fleet smg} "
    if [[ $want == *" stock "* ]]; then
        vllm_server vllm-serve 0 $((BASE + 41)) --api-server-count "$api"
        wait_http http://127.0.0.1:$((BASE + 41)) "$START_TIMEOUT" && systems+=("stock=http://127.0.0.1:$((BASE + 41))")
    fi
    [[ $want == *" fleet "* ]] && fleet_worker worker 0 $((BASE + 42))
    if [[ $want == *" fleet "* ]] && wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 42)); then
        gateway $((BASE + 43)) 127.0.0.1:$((BASE + 42)) --processes "$api"
        wait_http http://127.0.0.1:$((BASE + 43)) 60 && systems+=("fleet=http://127.0.0.1:$((BASE + 43))")
    fi
    if [[ $want == *" smg "* && -d ${SMG_SITE:-/nonexistent}/smg ]]; then
        smg_engine smg-engine 0 $((BASE + 44))
        if wait_grpc_health "$START_TIMEOUT" 127.0.0.1:$((BASE + 44)) "${PIDS[-1]}"; then
            smg_gateway $((BASE + 45)) $((BASE + 44))
            wait_http http://127.0.0.1:$((BASE + 45)) 120 && systems+=("smg=http://127.0.0.1:$((BASE + 45))")
        fi
    fi
    log "short: up: ${systems[*]}"
    local r order
    for ((r = 1; r <= rounds; r++)); do
        order=("${systems[@]}"); ((r % 2 == 0)) && order=($(printf '%s\n' "${systems[@]}" | tac))
        for system in "${order[@]}"; do bench "short-${system%%=*}-r$r" "${system#*=}"; done
    done
}

grid_variant() {  # grid_variant NAME PORT_OFFSET WORKER_OPTS ENV GATEWAY_OPTS: one more system for grid
    local name=$1 offset=$2 opts=$3 env_vars=$4 gateway_opts=$5 worker_port
    [[ -n $opts$env_vars$gateway_opts ]] || return 0
    if [[ -n $opts$env_vars ]]; then
        worker_port=$((BASE + offset))
        FLEET_EXTRA="$FLEET_EXTRA $opts" FLEET_PY="env $env_vars ${FLEET_PY#env }" \
            fleet_worker "worker-$name" 0 "$worker_port"
        profiles+=(--profile "$name=${PIDS[-1]}")
        wait_grpc "$START_TIMEOUT" 127.0.0.1:$worker_port || return 1
    else
        # Only the gateway differs (e.g. a routing policy, #49 goal 2): it fronts our system's own
        # worker, so the two are compared on one engine. On an engine of its own, one engine's
        # luck against another's (same options, same GPU) moved TTFT P50 up to 1.5x either way.
        worker_port=$((BASE + 42))
    fi
    gateway $((BASE + offset + 1)) 127.0.0.1:$worker_port ${GRID_GATEWAY_ARGS:-} $gateway_opts
    wait_http http://127.0.0.1:$((BASE + offset + 1)) 60 || return 1
    extra+=(--system "$name=http://127.0.0.1:$((BASE + offset + 1))")
    log "grid: $name = our worker (port $worker_port) with: ${opts:-nothing more}; env: ${env_vars:-nothing more}; its gateway with: ${gateway_opts:-nothing more}"
}

grid() {  # issue #49 goal 1: vLLM's own bench client (vllm_client_grid.py) on stock `vllm serve` and ours in turn
    local frac=${GRID_MEM:-0.28}
    MODEL=${GRID_MODEL:-${SHORT_MODEL:?set SHORT_MODEL (stage.sh makes the Qwen3-0.6B-shaped folder)}}
    NAME=${GRID_NAME:-qwen3-0.6b}
    [[ -f $MODEL/tokenizer.json ]] ||
        $FLEET_PY benchmarks/gpu/make_model.py --bench-words "${GRID_CONFIG:-benchmarks/gpu/configs/qwen3-0.6b}" "$MODEL" >/dev/null
    # The same engine options on both sides, the scheduler sizes given (not left to each side's defaults).
    ENGINE_OPTS=${GRID_ENGINE_OPTS:-"--load-format dummy --dtype bfloat16 --max-model-len 4096 --gpu-memory-utilization $frac --max-num-seqs 1024 --max-num-batched-tokens 16384 --seed 0"}
    VLLM_EXTRA=${GRID_VLLM_EXTRA:-} FLEET_EXTRA=${GRID_FLEET_EXTRA:-}
    export STOCK_CACHE_ROOT=${TMPDIR:-/tmp}/vllm-cache-short VLLM_CACHE_ROOT=${TMPDIR:-/tmp}/vllm-cache-short
    gpu_memory
    local extra=() profiles=()
    vllm_server vllm-serve 0 $((BASE + 41))
    profiles+=(--profile "stock=${PIDS[-1]}")
    wait_http http://127.0.0.1:$((BASE + 41)) "$START_TIMEOUT" || return 1
    fleet_worker worker 0 $((BASE + 42))
    profiles+=(--profile "ours=${PIDS[-1]}")
    wait_grpc "$START_TIMEOUT" 127.0.0.1:$((BASE + 42)) || return 1
    gateway $((BASE + 43)) 127.0.0.1:$((BASE + 42)) ${GRID_GATEWAY_ARGS:-}
    profiles+=(--profile "ours=${PIDS[-1]}")
    wait_http http://127.0.0.1:$((BASE + 43)) 60 || return 1
    # a third system: our worker with GRID_VARIANT's options added (e.g. a cost's off switch), its
    # environment with GRID_VARIANT_ENV's assignments, and/or its gateway with GRID_VARIANT_GATEWAY's
    # (e.g. --policy cache_aware, #49 goal 2); a fourth with GRID_VARIANT2, _ENV2, _GATEWAY2
    grid_variant variant 44 "${GRID_VARIANT:-}" "${GRID_VARIANT_ENV:-}" "${GRID_VARIANT_GATEWAY:-}" || return 1
    grid_variant variant2 46 "${GRID_VARIANT2:-}" "${GRID_VARIANT_ENV2:-}" "${GRID_VARIANT_GATEWAY2:-}" || return 1
    [[ -n ${GRID_PY_SPY:-} ]] && extra+=(--py-spy "$GRID_PY_SPY" "${profiles[@]}")
    # GRID_PROFILE_RATE: profile round 1's bench at this rate (default: the first of GRID_RATES)
    [[ -n ${GRID_PY_SPY:-} && -n ${GRID_PROFILE_RATE:-} ]] && extra+=(--profile-rate "$GRID_PROFILE_RATE")
    # GRID_WARMUPS=N: N untimed requests before every bench (vLLM's --num-warmups), so the first bench
    # after a system's start is not its cold one (12-07: stock's first 512-token bench ran at 1.4x its later TPOT).
    # GRID_OUT may name several answer lengths (GRID_NUM one count for all, or one each). GRID_DEADLINE
    # (s from this script's start) stops the client in time for the archive to be written, keeping
    # every finished bench for grid_ratios.py: on 12-07 three 0.6B systems took 245 s to start (the
    # first `vllm serve` compiles), and a call killed at its limit brought nothing back.
    local limit=()
    if [[ -n ${GRID_DEADLINE:-} ]]; then
        local left=$((GRID_DEADLINE - SECONDS))
        ((left > 0)) || left=1   # `timeout 0` would not stop it at all
        limit=(timeout -s INT "$left")
        log "grid: the client stops in $left s (GRID_DEADLINE $GRID_DEADLINE)"
    fi
    "${limit[@]}" $VLLM_PY benchmarks/gpu/vllm_client_grid.py --stock http://127.0.0.1:$((BASE + 41)) \
        --ours http://127.0.0.1:$((BASE + 43)) "${extra[@]}" --model "$MODEL" --served-name "$NAME" \
        --rates "${GRID_RATES:-100,200,400}" --rounds "${GRID_ROUNDS:-2}" --out-len "${GRID_OUT:-64}" \
        --num-prompts "${GRID_NUM:-2000}" --warmups "${GRID_WARMUPS:-0}" --results "$RESULTS/goal1" 2>&1 |
        tee "$RESULTS/goal1.txt"
}

wait_grpc_health() {  # wait_grpc_health SECONDS host:port [PID]: the standard gRPC health service says
    # SERVING; gives up at once if PID (the server, started by `start`) has exited
    $FLEET_PY - "$@" <<'PYEOF'
import os, sys, time, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
deadline = time.monotonic() + float(sys.argv[1])
pid = int(sys.argv[3]) if len(sys.argv) > 3 else None
channel = grpc.insecure_channel(sys.argv[2])
stub = health_pb2_grpc.HealthStub(channel)
while True:
    try:
        if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
            sys.exit(0)
    except grpc.RpcError:
        pass
    if pid is not None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit(f"{sys.argv[2]}: its server (pid {pid}) exited before SERVING")
    if time.monotonic() > deadline:
        sys.exit(f"{sys.argv[2]}: not SERVING after {sys.argv[1]} s")
    time.sleep(1)
PYEOF
}

scale() {  # issue #17 target 4: one port, N gateway processes, mock workers; no GPU needed
    $FLEET_PY benchmarks/gateway_scale.py --processes ${SCALE_N:-1 2 4} --client-processes ${SCALE_CLIENTS:-4} \
        --mock-workers ${SCALE_WORKERS:-4} --seconds ${SCALE_SECONDS:-10} --rounds ${SCALE_ROUNDS:-2} \
        --json "$RESULTS/scale.json" >"$RESULTS/scale.txt" 2>&1 || log "scale failed"
    nproc >>"$RESULTS/scale.txt"; log "scale: $(tail -4 "$RESULTS/scale.txt" | tr '\n' ' ')"
    [[ -n ${OUT:-} ]] && cp "$RESULTS/scale.txt" "$RESULTS/scale.json" "$OUT/" 2>/dev/null
    return 0
}

mock() {  # our worker (mock engine), gateway, bench, summary and archive: checks the stack, no GPU
    RATES=20,inf; NUM=20; INF_NUM=20; WARMUP=1; IN_LEN=16; OUT_LEN=16; PROMPT_FORMAT=auto
    start mock-worker "" $FLEET_PY -m vllm_fleet.cli worker --engine mock --served-model-name "$NAME" --port $((BASE + 31)) --mock-tokens-per-s 200
    wait_grpc 60 127.0.0.1:$((BASE + 31)) && bench mock-grpc grpc://127.0.0.1:$((BASE + 31))
    gateway $((BASE + 32)) 127.0.0.1:$((BASE + 31))
    wait_http http://127.0.0.1:$((BASE + 32)) 60 && bench mock-gateway http://127.0.0.1:$((BASE + 32))
    stop_all
}

smoke() {  # a tiny `single` on whatever is here, to check the script itself
    RATES=${SMOKE_RATES:-2,inf}; NUM=4; INF_NUM=6; WARMUP=1; IN_LEN=16; OUT_LEN=8
    single
}

log "phase $PHASE on $GPUS GPU(s), model $MODEL"
"$PHASE"
export_results
log "phase $PHASE finished"
