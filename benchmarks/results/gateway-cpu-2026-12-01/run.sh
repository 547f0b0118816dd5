#!/bin/bash
# Issue #17 before/after on the 2-core CPU VM (shared with other jobs), mock workers.
# before = /tmp/h16-before: HEAD d9a3f7e with gateway/{sse,asgi,access_log}.py as they were at 12d7af2
# after  = /tmp/h16-after:  HEAD d9a3f7e
# The mock worker runs from the before tree in every run: before and after differ in the gateway only.
# Rounds alternate the order, since the machine's load drifts.
# Run from a clone: bash benchmarks/results/gateway-cpu-2026-12-01/run.sh  (makes both worktrees
# under ${TMPDIR:-/tmp}; the venv comes from scripts/bootstrap.sh).
set -u
OUT=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$OUT/../../.." && pwd); cd "$ROOT"
[[ -n ${PY:-} ]] || source scripts/bootstrap.sh
WT=${TMPDIR:-/tmp}
[[ -d $WT/h16-after ]] || git worktree add --detach "$WT/h16-after" d9a3f7e
if [[ ! -d $WT/h16-before ]]; then
  git worktree add --detach "$WT/h16-before" d9a3f7e
  git -C "$WT/h16-before" checkout 12d7af2 -- src/vllm_fleet/gateway/sse.py src/vllm_fleet/gateway/asgi.py src/vllm_fleet/gateway/access_log.py
fi
B=$WT/h16-before/src; A=$WT/h16-after/src
stamp() { echo "=== $1 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; }
for tag in before after; do
  src=$B; [ $tag = after ] && src=$A
  stamp "profile $tag"; $PY benchmarks/gateway_profile.py --out $OUT --tag $tag --src $src --worker-src $B --seconds 10
done
for round in 1 2; do
  order="before after"; [ $round = 2 ] && order="after before"
  for tag in $order; do
    src=$B; [ $tag = after ] && src=$A
    stamp "gateway_overhead $tag round $round"
    $PY benchmarks/gateway_overhead.py --src $src --worker-src $B --json $OUT/overhead-$tag-$round.json
  done
done
stamp "gateway_scale after (N=1, N=2)"
$PY benchmarks/gateway_scale.py --src $A --seconds 10 --rounds 2 --json $OUT/scale.json
stamp done
