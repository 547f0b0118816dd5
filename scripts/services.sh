#!/usr/bin/env bash
# The system (Debian) packages the tests or the CPU comparison benchmark need. Run by test.sh
# before the venv is installed, so a missing one is named up front rather than ten minutes into
# an install or as a failing test.
#
#   bash scripts/services.sh [tests|benchmarks|all] [--print]
#
# As root: installs what is missing (apt-get). Otherwise, or with --print: lists what is missing
# and what needs it, prints the exact apt-get line, and exits 1.
set -euo pipefail
purpose=tests print_only=0
for arg in "$@"; do
  case $arg in
    tests|benchmarks|all) purpose=$arg ;;
    --print) print_only=1 ;;
    *) echo "usage: services.sh [tests|benchmarks|all] [--print]" >&2; exit 2 ;;
  esac
done

missing=() why=()
need() {  # need PACKAGE "WHAT NEEDS IT" cmd:NAME|file:PATH...: missing unless one of them is there
  local package=$1 reason=$2 probe; shift 2
  for probe in "$@"; do
    case $probe in
      cmd:*) command -v "${probe#cmd:}" >/dev/null && return 0 ;;
      file:*) [[ -f ${probe#file:} ]] && return 0 ;;
    esac
  done
  missing+=("$package") why+=("$reason")
}

for_tests() { [[ $purpose == tests || $purpose == all ]]; }
for_benchmarks() { [[ $purpose == benchmarks || $purpose == all ]]; }
need openjdk-17-jre-headless "java: Spark (tests/spark, Spark workers, benchmarks/spark_throughput.py) and the ZooKeeper test server" \
  cmd:java
# tests/zookeeper_server.py runs the server from Debian's jars.
for_tests && need zookeeper "ZooKeeper registry tests (tests/registry, tests/fleet, tests/router, tests/chaos)" \
  file:/usr/share/java/zookeeper.jar
for_tests && need chromium "the dashboard test in a headless browser (tests/gateway/test_dashboard.py)" \
  cmd:chromium cmd:chromium-browser
for_tests && need openssl "the TLS test's certificate (tests/gateway/test_tls.py)" cmd:openssl
for_benchmarks && need nginx "the round-robin baseline of benchmarks/compare.sh (nginx2)" cmd:nginx

[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "[services] missing Debian packages for the $purpose:" >&2
for i in "${!missing[@]}"; do printf '[services]   %-24s %s\n' "${missing[i]}" "${why[i]}" >&2; done
if [[ $EUID -eq 0 && $print_only -eq 0 ]]; then
  echo "[services] apt-get install -y ${missing[*]}" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
echo "[services] install them first: sudo apt-get install -y ${missing[*]}" >&2
exit 1
