#!/usr/bin/env bash
# Raw output for the headline figures of README.md / benchmarks/RESULTS.md that had none
# (issue #15): each step's full output in its own file, with the commit, the time and the load
# average before it. Run from a clone: bash benchmarks/results/headline-2026-12-01/run.sh
# (the venv comes from scripts/bootstrap.sh; output lands beside this script, or in $OUT).
# Each step holds /tmp/vllm-fleet-heavy.lock so that other jobs' engine runs wait.
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
[[ -n ${PY:-} ]] || source "$ROOT/scripts/bootstrap.sh"
out=${OUT:-$(cd "$(dirname "$0")" && pwd)}; mkdir -p "$out"
cd "$ROOT"
export PYTHONPATH=$ROOT/src
step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  {
    echo "# commit $(git -C "$ROOT" rev-parse --short HEAD)  $(date -u '+%F %T UTC')  load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
    echo "\$ ${*/#$PY/python}"   # the venv's python, named portably
  } > "$out/$name.txt"
  local t0=$SECONDS
  flock /tmp/vllm-fleet-heavy.lock timeout "$limit" "$@" >> "$out/$name.txt" 2>&1
  echo "# exit $? after $((SECONDS - t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/$name.txt"
}
only=${ONLY:-all}
want() { [[ $only == all || " $only " == *" $1 "* ]]; }
want reliability && step reliability 2400 "$PY" benchmarks/reliability.py --timing-samples 100000 --fuzz-examples 20 --engine
want worker_overhead && step worker_overhead 1500 "$PY" benchmarks/worker_overhead.py --prompts 32 --max-tokens 128 --rounds 4 --cores 0 --dtype float32
want spark_mock && step spark_mock 900 "$PY" benchmarks/spark_throughput.py --engine mock --rows 2000 --latency-rows 40 --rate 2
want spark_vllm && step spark_vllm 1800 "$PY" benchmarks/spark_throughput.py --engine vllm --rows 300 --max-tokens 16 --latency-rows 20 --dtype float32
want gateway_overhead && step gateway_overhead 900 "$PY" benchmarks/gateway_overhead.py --json "benchmarks/results/headline-2026-12-01/gateway_overhead.json"
want capacity && step capacity 900 "$PY" -m pytest -p no:cacheprovider -q -s tests/fleet/test_capacity_vllm.py
want session_affinity && step session_affinity 1800 "$PY" benchmarks/session_affinity.py
echo "# done $(date -u '+%F %T UTC')" >> "$out/reliability.txt"
