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
set +e
"$PY" -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests collected: failing" >&2; exit 1; fi
exit "$rc"
