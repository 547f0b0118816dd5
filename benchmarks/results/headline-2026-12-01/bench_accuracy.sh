#!/usr/bin/env bash
# The bench harness's own checks ("Bench harness" in RESULTS.md): against a mock worker at exactly
# 100 tokens/s (TPOT 10 ms by construction), and its ceiling against a 5,000 tokens/s mock.
# Run from a clone: bash benchmarks/results/headline-2026-12-01/bench_accuracy.sh > bench_accuracy.txt
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
[[ -n ${PY:-} ]] || source "$ROOT/scripts/bootstrap.sh"
export PYTHONPATH=$ROOT/src
echo "# commit $(git -C "$ROOT" rev-parse --short HEAD)  $(date -u '+%F %T UTC')  load $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # run PORT TOKENS_PER_S TTFT_MS BENCH_ARGS...: one mock worker, the bench against it
  local port=$1 tps=$2 ttft=$3; shift 3
  "$PY" -m vllm_fleet.cli worker --engine mock --port "$port" --mock-tokens-per-s "$tps" --mock-ttft-ms "$ttft" >/dev/null 2>&1 &
  local pid=$!
  echo "\$ vllm-fleet worker --engine mock --port $port --mock-tokens-per-s $tps --mock-ttft-ms $ttft &"
  echo "\$ vllm-fleet bench --target grpc://127.0.0.1:$port $*"
  "$PY" -c "import asyncio, sys; from vllm_fleet.client import WorkerClient
async def main():
    client = WorkerClient(sys.argv[1]); await client.wait_serving(timeout=60); await client.close()
asyncio.run(main())" "127.0.0.1:$port" || { echo "mock worker on $port did not serve"; kill "$pid"; return 1; }
  "$PY" -m vllm_fleet.cli bench --target "grpc://127.0.0.1:$port" --no-progress "$@" 2>&1 | grep -v "^\[bench\]"
  kill "$pid"; wait "$pid" 2>/dev/null
}
run 50931 100 20 --rate 10 --num-requests 100 --input-len 16 --output-len 64
run 50932 5000 1 --rate inf --num-requests 500 --input-len 16 --output-len 64
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)"
