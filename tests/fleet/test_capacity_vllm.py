"""Our capacity model against the KV capacity a real vLLM engine reports (CPU, default model).

The engine is the session's shared real worker (tests/conftest.py): its Info carries the block
size and block count vLLM's cache config settled on, and the dtype it runs (float32 there, see
support.vllm_worker_args). A probe engine of its own cost this test ~40 s more.
"""

from __future__ import annotations

import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.capacity import GiB, DeviceSpec, EngineSettings, estimate
from vllm_fleet.fleet.model_shape import load_shape
from vllm_fleet.fleet.worker_process import small_vllm_args
from vllm_fleet.models import resolve_model

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _option(args: list[str], name: str) -> float:
    return float(args[args.index(name) + 1])


@pytest.mark.engine
async def test_kv_tokens_within_ten_percent_of_vllm(vllm_worker):
    async with WorkerClient(vllm_worker.address) as client:
        settings = (await client.info()).settings
    block_size, blocks = int(settings["block_size"]), int(settings["num_kv_blocks"])
    vllm_tokens = blocks * block_size
    assert blocks > 0, settings

    # The options the shared worker runs with (small_vllm_args' defaults).
    args = small_vllm_args()
    kv_space = _option(args, "--kv-cache-space-gb")
    device = DeviceSpec(name="cpu", kind="cpu", memory_bytes=16 * GiB, kv_cache_space_bytes=int(kv_space * GiB))
    ours = estimate(load_shape(resolve_model(None).path), device,
                    EngineSettings(max_model_len=int(_option(args, "--max-model-len")), block_size=block_size,
                                   kv_cache_dtype_bytes=DTYPE_BYTES[settings["dtype"]]))
    print(f"vLLM: {vllm_tokens} tokens ({blocks} blocks of {block_size}, {settings['dtype']}); "
          f"ours: {ours.kv_tokens} tokens, {ours.num_blocks} blocks")
    assert ours.kv_tokens == pytest.approx(vllm_tokens, rel=0.10)
    assert ours.num_blocks == pytest.approx(blocks, rel=0.10)
