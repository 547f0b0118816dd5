#!/usr/bin/env bash
# Brings vLLM 0.26.0 and our package onto the GPU machine, which has Python 3.12, torch
# 2.11+cu130, no vLLM and no package index, and takes files in parts of at most 64 MiB.
# The parts are made here by `benchmarks/gpu/prepare.sh` (into .gpu/, git-ignored). Then, on
# the GPU machine, in back-to-back runs while it stays up (the repo folder there is laid anew on
# every run, so each part is copied out of it first):
#
# The sequence used since 2026-12-03 (pack_vllm.sh and pack_bundle.sh write the parts; the repo
# is ~26 MB of each run's 64 MiB, so one part travels per run, none left out):
#   runs 1-3, carry .gpu/vllm.part0N:   bash benchmarks/gpu/stage.sh part .gpu/vllm.part0N
#     (run 3 may carry .gpu/core.part04 too and stage it the same way)
#   runs 4-6, carry .gpu/core.part0N (N = 0, 1, 2):   bash benchmarks/gpu/stage.sh part .gpu/core.part0N
#   run 7, carry .gpu/core.part03:
#       bash benchmarks/gpu/stage.sh part .gpu/core.part03 && bash benchmarks/gpu/stage.sh unbundle core \
#         && STAGE_FROM=/tmp/stage bash benchmarks/gpu/stage.sh install && source /tmp/gpu-env.sh
#   then pool_cache.sh, run.sh, suite.sh (carry .gpu/smg and run `stage.sh install` again for SMG).
#
# The lean sequence of 2026-12-06 (enough for `run.sh grid` / `short`: no LoRA adapter, no real
# SmolLM2, no Spark), five runs: after prepare.sh, here
#   (cd .gpu && tar -cf - deps fleet srv third_party.tgz | split -b 28M -d - lean.part)
#   runs 1-3, carry .gpu/vllm.part0N:   bash benchmarks/gpu/stage.sh part .gpu/vllm.part0N
#   run 4, carry .gpu/lean.part00:      bash benchmarks/gpu/stage.sh part .gpu/lean.part00
#   run 5, carry .gpu/lean.part01:      bash benchmarks/gpu/stage.sh part .gpu/lean.part01 &&
#       bash benchmarks/gpu/stage.sh unbundle lean && STAGE_FROM=/tmp/stage bash benchmarks/gpu/stage.sh install
#   (one call at a time, each within seconds of the last; ~25 s of device time for all five)
#   Since the repo passed ~27 MB (2026-12-06), 37 MiB parts no longer fit beside it: re-split vLLM
#   into 28 MiB parts, (cd .gpu && mkdir -p v28 && cat vllm.part0* | split -b 28M -d - v28/vllm.part),
#   and carry .gpu/v28/vllm.part0N in runs 1-4 (lean parts in runs 5-6); `install` joins vllm.part*.
#   With the repo at ~36 MB (2026-12-07) one 28 MiB part is all a run can carry: py-spy (8 MB,
#   .gpu/pyspy) needs a run of its own. Keep raw results small (benchmarks/RESULTS.md says how they
#   are trimmed): every MB the repo grows is a MB less per run here.
#
# The first sequence, of 2026-12-01 (the repo itself is ~10 MB of each run's 64 MiB, so vLLM travels in
# three 37 MiB parts; pack_vllm.sh writes them):
#   run 1, carry .gpu/vllm.part00 .gpu/srv .gpu/third_party.tgz .gpu/fleet:
#       bash benchmarks/gpu/stage.sh part .gpu/vllm.part00 && bash benchmarks/gpu/stage.sh install
#   run 2, carry .gpu/vllm.part01:   bash benchmarks/gpu/stage.sh part .gpu/vllm.part01
#   run 3, carry .gpu/vllm.part02:   bash benchmarks/gpu/stage.sh part .gpu/vllm.part02
#   run 4, carry .gpu/deps .gpu/third_party.tgz:
#       bash benchmarks/gpu/stage.sh install && source /tmp/gpu-env.sh && benchmarks/gpu/run.sh mock
#   run 5, carry .gpu/smg (SMG for issue #17: `bash benchmarks/smg/install.sh download .gpu/smg`):
#       bash benchmarks/gpu/stage.sh install && source /tmp/gpu-env.sh && benchmarks/gpu/run.sh short
#   later runs:  source /tmp/gpu-env.sh && benchmarks/gpu/run.sh single|pair|scale ...
# Start each run within seconds of the last one's end: a machine idle for 30 s is given back,
# and a fresh one needs every staging run and cold engine starts (~3.5 min each) again.
# `install` installs whichever parts this run carried, so each run's step is the same command.
#
# Everything staged lives under $GPU_STAGE_ROOT (default /tmp, the paths above), outside the
# repo folder that each run lays anew. vLLM and its missing dependencies go to ROOT/site
# (PYTHONPATH of stock vLLM); the versions of grpcio/protobuf our generated code needs go to
# ROOT/fleet-site, first on our processes' path only, so the stock server runs exactly as it
# would without us.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=${GPU_STAGE_ROOT:-/tmp}
SITE=$ROOT/site FLEET_SITE=$ROOT/fleet-site MODEL_DIR=$ROOT/models/qwen3.5-9b

case ${1:?usage: stage.sh part FILE | keep SRC NAME | unbundle NAME | install} in
part)
    mkdir -p "$ROOT/stage" && cp "${2:?part file}" "$ROOT/stage/"
    ls -la "$ROOT/stage" ;;
keep)  # keep SRC (a file or a folder's files) as ROOT/stage/NAME: parts of one folder from several runs
    src=${2:?source} name=${3:?name under the stage folder}
    mkdir -p "$ROOT/stage/$name"
    if [[ -d $src ]]; then cp -r "$src"/. "$ROOT/stage/$name/"; else cp "$src" "$ROOT/stage/$name/"; fi
    du -sh "$ROOT/stage/$name" ;;
unbundle)  # ROOT/stage/NAME.part* (pack_bundle.sh's chunks of one tar, one per run) into ROOT/stage/
    name=${2:?bundle name}
    cat "$ROOT"/stage/"$name".part* | tar -x -C "$ROOT/stage"
    echo "unbundled $name: $(ls "$ROOT/stage" | tr '\n' ' ')" ;;
install)
    # Staged parts come from this run's $SRC/ or, with STAGE_FROM=$ROOT/stage, from what `keep` kept.
    SRC=${STAGE_FROM:-.gpu}
    # Each part once: a later run may find this run's ignored $SRC/ folders still in the repo folder.
    done_once() { [[ -f $ROOT/stage/.done-$1 ]]; }
    mark() { mkdir -p "$ROOT/stage" && touch "$ROOT/stage/.done-$1"; }
    if [[ -f $SRC/nginx.deb ]]; then
        dpkg -x $SRC/nginx.deb "$ROOT/nginx" && "$ROOT/nginx/usr/sbin/nginx" -v
    fi
    if [[ -d $SRC/fleet ]] && ! done_once fleet; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$FLEET_SITE" $SRC/fleet/*.whl
        echo "our wheels: $(ls $SRC/fleet | tr '\n' ' ')"; mark fleet
    fi
    if [[ -d $SRC/deps ]] && ! done_once deps; then
        mkdir -p "$SITE"
        cat "$ROOT"/stage/vllm.part* | xz -dc -T0 | tar -x -C "$SITE"
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $SRC/deps/*.whl
        tar -xzf $SRC/third_party.tgz -C "$SITE"; mark deps
    fi
    if [[ -d $SRC/smg ]] && ! done_once smg; then  # SMG (issue #17): its gateway and vLLM's gRPC servicer
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$ROOT/smg-site" $SRC/smg/*.whl
        echo "smg: $(ls $SRC/smg | tr '\n' ' ')"; mark smg
    fi
    if [[ -d $SRC/srv ]] && ! done_once srv; then  # what vLLM's OpenAI server imports beyond the engine's path
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $SRC/srv/*.whl
        echo "vLLM: $(du -sh $SITE | cut -f1) in $SITE"; mark srv
    fi
    # Real SmolLM2-135M weights: the GGUF our package ships, converted as `vllm-fleet` does on CPU.
    if [[ -f $SRC/smol.gguf && ! -f $ROOT/models/smollm2/config.json ]]; then
        PYTHONPATH=$FLEET_SITE:$PWD/src:$SITE python3 -c "
import sys; from pathlib import Path; from vllm_fleet.models import _convert_gguf
_convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))" "$SRC/smol.gguf" "$ROOT/models/smollm2"
        echo "real SmolLM2-135M in $ROOT/models/smollm2: $(ls $ROOT/models/smollm2 | tr '\n' ' ')"
    fi
    # Spark (issue #28): Debian's JRE 17 unpacked (its links into /etc made copies), a pruned
    # pyspark (pack_bundle.sh), and pandas/pyarrow where the image lacks them.
    if [[ -f $SRC/spark/jre.deb ]] && ! done_once jre; then
        dpkg -x "$SRC/spark/jre.deb" "$ROOT/jre"
        find "$ROOT/jre/usr/lib/jvm" -type l -lname '/*' | while read -r link; do
            target=$(readlink "$link"); rm "$link"
            if [[ -e $ROOT/jre$target ]]; then cp -r "$ROOT/jre$target" "$link"; fi
        done
        "$ROOT/jre/usr/lib/jvm/java-17-openjdk-amd64/bin/java" -version 2>&1 | head -1; mark jre
    fi
    if [[ -f $SRC/spark/pyspark.tar.xz ]] && ! done_once pyspark; then
        mkdir -p "$ROOT/spark-site" && xz -dc -T0 "$SRC/spark/pyspark.tar.xz" | tar -x -C "$ROOT/spark-site"; mark pyspark
    fi
    if [[ -d $SRC/spark/py ]] && ! done_once sparkpy; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$ROOT/spark-site" $SRC/spark/py/*.whl
        mark sparkpy
    fi
    [[ -f $MODEL_DIR/tokenizer.json ]] || python3 benchmarks/gpu/make_model.py benchmarks/gpu/configs/qwen3.5-9b "$MODEL_DIR"
    # A plain-attention 8B shape for cache routing (its prefill costs what a real 8B's does; the
    # 9B's linear-attention layers change how vLLM caches prefixes).
    [[ -f $ROOT/models/qwen3-8b/tokenizer.json ]] || python3 benchmarks/gpu/make_model.py benchmarks/gpu/configs/qwen3-8b "$ROOT/models/qwen3-8b"
    cat >"$ROOT/gpu-env.sh" <<ENV
export VLLM_PY="env PYTHONPATH=$SITE python3"
export FLEET_PY="env PYTHONPATH=$FLEET_SITE:$PWD/src:$SITE:$ROOT/spark-site JAVA_HOME=$ROOT/jre/usr/lib/jvm/java-17-openjdk-amd64 python3"
export SMOL_REAL=$ROOT/models/smollm2 QWEN3_8B=$ROOT/models/qwen3-8b
export MODEL=$MODEL_DIR NGINX=$ROOT/nginx/usr/sbin/nginx
export SITE=$SITE FLEET_SITE=$FLEET_SITE SMG_SITE=$ROOT/smg-site SHORT_MODEL=$ROOT/models/qwen3-0.6b
export VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENV
    echo "env in $ROOT/gpu-env.sh" ;;
*)
    echo "usage: stage.sh part FILE | keep SRC NAME | install" >&2; exit 2 ;;
esac
