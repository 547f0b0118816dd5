#!/usr/bin/env bash
# Builds, on a machine with PyPI, the parts benchmarks/gpu/stage.sh installs on the GPU machine:
#   .gpu/vllm.part00..02, .gpu/deps/, .gpu/third_party.tgz  (vLLM 0.26.0, pruned:
#       benchmarks/gpu/pack_vllm.sh, verified on an H200 on 2026-11-30)
#   .gpu/fleet/   grpcio, protobuf and grpcio-health-checking at the versions our generated code needs,
#                 nvidia-ml-py (GPU discovery through NVML) and aiohttp (the bench's HTTP client)
#   .gpu/srv/     what vLLM's OpenAI server imports beyond the engine's path (pack_vllm.sh covers
#                 only the offline engine): watchfiles, model-hosting-container-standards, ...
#   .gpu/nginx.deb  Debian's nginx, for the round-robin baseline (unpacked with dpkg -x there)
# .gpu/ must stay out of git: echo /.gpu/ >> .git/info/exclude
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.gpu
[[ -f $OUT/vllm.part02 ]] || bash benchmarks/gpu/pack_vllm.sh "$OUT"
# The versions below are the ones our venv runs with: $PY, else the project venv (bootstrap.sh
# creates or reuses it and sets PY).
[[ -n ${PY:-} ]] || source scripts/bootstrap.sh
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p "$OUT/fleet"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$OUT/fleet" "grpcio==$(version grpcio)" "protobuf==$(version protobuf)" \
    "grpcio-health-checking==$(version grpcio-health-checking)" "nvidia-ml-py>=12" \
    "aiohttp==$(version aiohttp)" "yarl==$(version yarl)" "multidict==$(version multidict)" \
    "frozenlist==$(version frozenlist)" "propcache==$(version propcache)" "aiosignal==$(version aiosignal)" \
    "aiohappyeyeballs==$(version aiohappyeyeballs)" "orjson==$(version orjson)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$OUT/srv" \
    watchfiles model-hosting-container-standards jmespath supervisor python-multipart
(cd "$OUT" && apt-get download nginx && mv nginx_*.deb nginx.deb)
du -sh "$OUT"/*
