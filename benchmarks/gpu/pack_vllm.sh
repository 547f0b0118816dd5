#!/usr/bin/env bash
# Packs vLLM 0.26.0 for the GPU machine (Python 3.12, torch 2.11+cu130, no vLLM, no package
# index, files in parts of at most 64 MiB). 0.26.0 is the newest vLLM that pins torch 2.11, the
# image's torch; its wheel links CUDA 13 and the stable libtorch ABI, as the image's torch does.
# Run by benchmarks/gpu/prepare.sh on a machine with PyPI; writes into OUT (default .gpu):
#   vllm.part00..03           a pruned vLLM package (tar.xz, split into 28 MiB parts)
#   deps/                     wheels of what vLLM's engine imports and the image lacks
#   third_party.tgz           vLLM's small vendored modules (pynvml, flash_linear_attention, ...)
# benchmarks/gpu/stage.sh installs them there. Verified on an H200 on 2026-11-30 with
# Qwen3-8B- and Qwen3.5-9B-shaped models (load_format="dummy"; Qwen3.5 needs
# gdn_prefill_backend="triton", as flashinfer is not shipped).
set -euo pipefail
OUT=${1:-.gpu}
VLLM_VERSION=0.26.0
PART_SIZE=28M   # under the 64 MiB a run carries, with room for the repo (~27 MB) and nothing else

# pip download for the GPU image (CPython 3.12, any manylinux x86_64 glibc it runs), not for here.
download_for_gpu() {
  local platforms=() tag
  for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31; do
    platforms+=(--platform "${tag}_x86_64")
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any "${platforms[@]}" "$@"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT/deps" "$work/site"

download_for_gpu -d "$work" "vllm==$VLLM_VERSION"
unzip -q "$work"/vllm-"$VLLM_VERSION"-*.whl -d "$work/site"
pkg="$work/site/vllm"

# The vendored modules travel on their own (small, needed by the kernels we keep).
tar -czf "$OUT/third_party.tgz" -C "$work/site" vllm/third_party/__init__.py vllm/third_party/pynvml.py \
  vllm/third_party/flashmla vllm/third_party/flash_linear_attention vllm/third_party/triton_kernels \
  vllm/third_party/tml_fa4
# What a dense or Gated-DeltaNet text model on Hopper never loads, dropped to fit two parts:
# FlashAttention-2 kernels (Hopper uses FA3), the Rust front end, vendored sources (packed
# above), MLA and FP4 kernels, and the OpenAPI docs' static bundle.
rm -rf "$pkg/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$pkg/vllm-rs" "$pkg/third_party" "$pkg"/_flashmla*.so \
  "$pkg/_qutlass_C.abi3.so" "$pkg/entrypoints/serve/instrumentator/static"
tar -C "$work/site" -cf - . | xz -6 -T0 >"$work/vllm-site.tar.xz"
split -b "$PART_SIZE" -d "$work/vllm-site.tar.xz" "$OUT/vllm.part"

# The engine's imports that the image does not already have (it has torch, transformers,
# tokenizers, triton, numba, numpy). Pins: the versions vLLM 0.26.0 was verified with.
download_for_gpu -d "$OUT/deps" \
  msgspec pyzmq blake3 cbor2 pybase64 cachetools diskcache ijson setproctitle loguru \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection pydantic-extra-types \
  openai==3.57.0 httpx2 httpcore2 distro jiter sniffio partial-json-parser openai-harmony \
  gguf compressed-tensors==0.17.0 depyf==0.20.0 astor dill mistral_common pycountry \
  jsonschema referencing rpds-py jsonschema-specifications python-json-logger \
  lm-format-enforcer==0.11.3 interegular outlines_core==0.2.14 xgrammar==0.2.8 \
  apache-tvm-ffi==0.1.15.post2 llguidance==1.7.6 lark==1.2.2 nvtx==0.2.15 \
  fastapi==0.136.3 starlette==1.10.0 annotated-doc prometheus-fastapi-instrumentator \
  uvicorn h11 httptools uvloop
ls -la "$OUT" | tail -n +2
