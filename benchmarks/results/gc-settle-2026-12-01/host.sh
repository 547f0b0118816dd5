#!/usr/bin/env bash
# Target 3 on the GPU host's CPUs (no GPU used), old gateway vs new, alternating, twice.
# Carried: .gpu/mock (the gateway's wheels for the host's Python 3.12) and .gpu/old-src (the
# src/ of commit 3b705b0, before the GC settle). Writes $OUT/{old,new}{1,2}.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=$PWD M=/tmp/mock-site
python3 -m pip install -q --no-index --no-deps --target "$M" .gpu/mock/*.whl
echo "host: $(nproc) cores, $(python3 --version), load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%FT%TZ)"
export PYTHONPATH=$R/src:$M
for i in 1 2; do
    for side in old new; do
        if [[ $side == old ]]; then S=$R/.gpu/old-src; else S=$R/src; fi
        echo "== $side$i $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
        python3 benchmarks/gateway_overhead.py --src "$S:$M" --worker-src "$R/src:$M" \
            --json "$OUT/$side$i.json" > "$OUT/$side$i.txt" 2>&1 || echo "failed: $(tail -3 "$OUT/$side$i.txt")"
        grep '^added TTFT' "$OUT/$side$i.txt" || true
    done
done
