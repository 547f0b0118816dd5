#!/usr/bin/env bash
# The test command: checks (as root: installs) the system packages the tests need, installs the
# venv, runs pytest.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# First, so a missing package is named before the venv's ~10-minute install, not after it.
bash "$repo_root/scripts/services.sh" tests
source "$repo_root/scripts/bootstrap.sh"
cd "$repo_root"
export PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
# Where pytest was and what it said, for the lines printed after it when it fails: CI keeps only
# the head and tail of a long output. Unbuffered, so its stdout and stderr keep their order.
diag_dir=$(mktemp -d)
trap 'rm -rf "$diag_dir"' EXIT
export VLLM_FLEET_TEST_PROGRESS="$diag_dir/running" PYTHONUNBUFFERED=1
set +e
# Three pytest processes (pytest-xdist): much of the suite waits on processes, sockets and
# deadlines rather than on a core, so three overlap on 2 cores (README: the suite's figures).
# conftest.py keeps what is heavy to start (the session's real engines, Spark's JVM) in one
# process each. `-n 0` (or VLLM_FLEET_TEST_PROCESSES=0) runs the suite in one process.
"$PY" -m pytest -p no:cacheprovider -n "${VLLM_FLEET_TEST_PROCESSES:-3}" --dist loadgroup --no-loadscope-reorder "$@" 2>&1 | tee "$diag_dir/log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
  echo "pytest exited $rc; the last test each of its processes started: $(cat "$diag_dir"/running* 2>/dev/null || echo none)"
  # 3 is pytest's internal error: its own lines say where, and must not be lost in the middle.
  grep -m 40 -E '^INTERNALERROR>|^E   |Timeout \(>|^mainloop:' "$diag_dir/log" || true
fi
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests collected: failing" >&2; exit 1; fi
exit "$rc"
