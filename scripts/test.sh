#!/usr/bin/env bash
# The test command: installs what is needed, starts the services the tests need, runs pytest.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo_root/scripts/bootstrap.sh"
source "$repo_root/scripts/services.sh"
cd "$repo_root"
export PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
set +e
"$PY" -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests collected: failing" >&2; exit 1; fi
exit "$rc"
