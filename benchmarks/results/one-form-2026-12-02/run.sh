#!/usr/bin/env bash
# Before/after issue #25 (one request, one form), alternating, each checkout's own script against
# its own code (the request's wire form changed, so one side's client cannot drive the other's worker).
# Run from a clone: bash benchmarks/results/one-form-2026-12-02/run.sh [AFTER_REV]
# --src matters: gateway_overhead.py sets its own PYTHONPATH for the gateway (the GC probe), so without it
# the gateway runs the venv's editable install, whatever checkout the script comes from.
# (makes the two worktrees under ${TMPDIR:-/tmp}; the venv comes from scripts/bootstrap.sh; output
# lands in $OUT, default ${TMPDIR:-/tmp}/bench25).
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
[[ -n ${PY:-} ]] || source "$ROOT/scripts/bootstrap.sh"
WT=${TMPDIR:-/tmp}
B=$WT/one-form-before; A=$WT/one-form-after
[[ -d $B ]] || git -C "$ROOT" worktree add --detach "$B" a845c96
[[ -d $A ]] || git -C "$ROOT" worktree add --detach "$A" "${1:-HEAD}"
out=${OUT:-$WT/bench25}; mkdir -p "$out"
cd "$WT"
for r in 1 2 3; do
  for side in before after; do
    dir=$B; [ $side = after ] && dir=$A
    echo "=== worker_delta_cost $side round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/delta.txt"
    PYTHONPATH=$dir/src timeout 900 "$PY" "$dir/benchmarks/worker_delta_cost.py" --streams 256 --tokens 200 \
      --tokens-per-s 40 --src "$dir/src" --rounds 1 >> "$out/delta.txt" 2>&1
  done
done
for r in 1 2; do
  for side in before after; do
    dir=$B; [ $side = after ] && dir=$A
    echo "=== gateway_overhead --quick $side round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/gateway.txt"
    PYTHONPATH=$dir/src timeout 900 "$PY" "$dir/benchmarks/gateway_overhead.py" --quick --src "$dir/src" --worker-src "$dir/src" \
      --json "$out/gw-$side-$r.json" \
      >> "$out/gateway.txt" 2>&1
  done
done
echo DONE >> "$out/gateway.txt"
