"""Our capacity model against the KV capacity a real vLLM engine reports (CPU, default model).

Costs one engine start (~30 s); run heavy tests under `flock /tmp/vllm-fleet-heavy.lock`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet.fleet.capacity import GiB, DeviceSpec, EngineSettings, estimate
from vllm_fleet.fleet.model_shape import load_shape
from vllm_fleet.models import resolve_model

PROBE = Path(__file__).parent / "vllm_kv_probe.py"
KV_SPACE_GIB = 1
MAX_MODEL_LEN = 2048


@pytest.mark.engine
def test_kv_tokens_within_ten_percent_of_vllm():
    model = resolve_model(None).path
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0")}
    done = subprocess.run([sys.executable, str(PROBE), model, str(KV_SPACE_GIB), str(MAX_MODEL_LEN)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("KV_PROBE ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    reported = json.loads(lines[-1].removeprefix("KV_PROBE "))
    vllm_tokens = reported["num_gpu_blocks"] * reported["block_size"]

    device = DeviceSpec(name="cpu", kind="cpu", memory_bytes=16 * GiB, kv_cache_space_bytes=KV_SPACE_GIB * GiB)
    ours = estimate(load_shape(model), device, EngineSettings(max_model_len=MAX_MODEL_LEN,
                                                              block_size=reported["block_size"]))
    print(f"vLLM: {vllm_tokens} tokens ({reported}); ours: {ours.kv_tokens} tokens, {ours.num_blocks} blocks")
    assert ours.kv_tokens == pytest.approx(vllm_tokens, rel=0.10)
    assert ours.num_blocks == pytest.approx(reported["num_gpu_blocks"], rel=0.10)
