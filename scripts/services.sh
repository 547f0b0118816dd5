#!/usr/bin/env bash
# Installs system services the tests need (Debian packages). Idempotent; sourced by test.sh.
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
[ -d /usr/share/zookeeper ] || need+=(zookeeper)
command -v nginx >/dev/null || need+=(nginx)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[services] apt-get install ${need[*]}" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "[services] missing ${need[*]}; install them (Debian: sudo apt-get install ${need[*]})" >&2
  fi
fi
