#!/usr/bin/env bash
# Regenerates the committed Python code for src/vllm_fleet/protocol/worker.proto.
#   bash scripts/gen_proto.sh [python]      (needs grpcio-tools: the `dev` extra)
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${1:-${PY:-python3}}
cd "$repo_root/src"
"$py" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. vllm_fleet/protocol/worker.proto
