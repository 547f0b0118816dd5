#!/usr/bin/env bash
# Before/after #13, alternating, each checkout's own script against its own code.
# Run from a clone: bash benchmarks/results/reshape-13/run.sh  (makes the two worktrees under
# ${TMPDIR:-/tmp}; the venv comes from scripts/bootstrap.sh; output lands in $out).
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
[[ -n ${PY:-} ]] || source "$ROOT/scripts/bootstrap.sh"
WT=${TMPDIR:-/tmp}
B=$WT/reshape-before; A=$WT/reshape-after
[[ -d $B ]] || git -C "$ROOT" worktree add --detach "$B" bb40c75
[[ -d $A ]] || git -C "$ROOT" worktree add --detach "$A" 1e9d909
out=${OUT:-$WT/bench13}; mkdir -p "$out"
cd "$WT"
for r in 1 2; do
  for side in before after; do
    dir=$B; [ $side = after ] && dir=$A
    echo "=== router_overhead $side round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/router.txt
    PYTHONPATH=$dir/src timeout 600 $PY $dir/benchmarks/router_overhead.py >> $out/router.txt 2>&1
  done
done
echo "=== worker_delta_cost $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/delta.txt
PYTHONPATH=$A/src timeout 900 $PY $A/benchmarks/worker_delta_cost.py --streams 256 --tokens 200 --tokens-per-s 40 --src $A/src --src $B/src --rounds 3 >> $out/delta.txt 2>&1
for r in 1 2; do
  for side in before after; do
    dir=$B; [ $side = after ] && dir=$A
    echo "=== gateway_overhead $side round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/gateway.txt
    PYTHONPATH=$dir/src timeout 900 $PY $dir/benchmarks/gateway_overhead.py --json $out/gw-$side-$r.json >> $out/gateway.txt 2>&1
  done
done
echo DONE >> $out/router.txt
