#!/usr/bin/env bash
# The main job on the embedded default: a real vLLM worker on CPU with SmolLM2, streaming answers.
#   bash scripts/demo.sh [vllm-fleet demo options]
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo_root/scripts/bootstrap.sh"
exec "$PY" -m vllm_fleet.cli demo "$@"
