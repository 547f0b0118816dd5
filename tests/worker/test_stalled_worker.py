"""A worker whose engine stalls (requests running, no output) while its own loop stays alive:
it turns NOT_SERVING, ends every stream it holds with UNAVAILABLE (an error, never a clean end,
so a router moves the stream), refuses new work, and exits with its own code for the supervisor.

The engine is the mock's stall double (`--mock-stall-file`); the real engine's EngineCore is
stopped with SIGSTOP in tests/chaos/test_engine_stall.py.
"""

from __future__ import annotations

import asyncio

import pytest

from support import wait_until
from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.worker.server import EXIT_ENGINE_STALLED

pytestmark = pytest.mark.timeout(120)


async def read_until_error(client: WorkerClient, request_id: str, first: asyncio.Event) -> tuple[int, Exception | None]:
    """Tokens received before the stream ended, and the error it ended with (None: a clean end)."""
    tokens = 0
    request = build_request(request_id, [GenerateInput(text="a b c")], SamplingParams(max_tokens=2000, ignore_eos=True))
    try:
        async for chunk in client.generate(request, timeout=60):
            tokens += len(chunk.token_ids)
            first.set()
    except WorkerUnavailableError as exc:
        return tokens, exc
    return tokens, None


@pytest.mark.parametrize("multiplex", [True, False], ids=["one-call-for-all", "one-call-per-request"])
async def test_a_stalled_engine_fails_its_streams_and_the_worker_exits(mock_worker_factory, tmp_path, multiplex):
    stall_file = tmp_path / "stall"
    worker = await mock_worker_factory.start(mock_tokens_per_s=100, mock_ttft_ms=5, mock_stall_file=str(stall_file))
    async with WorkerClient(worker.address, ClientOptions(multiplex=multiplex)) as client:
        firsts = [asyncio.Event() for _ in range(4)]
        streams = [asyncio.ensure_future(read_until_error(client, f"s{i}", first)) for i, first in enumerate(firsts)]
        await wait_until(lambda: all(f.is_set() for f in firsts), timeout=20, message="every stream's first chunk")
        stall_file.touch()
        results = await asyncio.wait_for(asyncio.gather(*streams), timeout=30)
        assert all(tokens > 0 for tokens, _ in results)
        assert all(isinstance(error, WorkerUnavailableError) for _, error in results), results
        assert await client.health(timeout=2) == "NOT_SERVING"
        with pytest.raises(WorkerUnavailableError):
            async for _ in client.generate(build_request("late", [GenerateInput(text="x")],
                                                           SamplingParams(max_tokens=3)), timeout=10):
                pass
    assert await asyncio.wait_for(worker.wait_exit(), timeout=30) == EXIT_ENGINE_STALLED
    assert "engine stalled" in worker.log_tail(40)


async def test_a_long_quiet_stream_on_a_live_engine_is_not_a_stall(mock_worker_factory):
    """Slow steps (here 1.5 s each, below the 4 s cap of 10 × step) are not a stall."""
    worker = await mock_worker_factory.start(mock_tokens_per_s=0.66, mock_ttft_ms=5)
    async with WorkerClient(worker.address) as client:
        request = build_request("slow", [GenerateInput(text="a")], SamplingParams(max_tokens=5, ignore_eos=True))
        chunks = [c async for c in client.generate(request, timeout=60)]
        assert sum(len(c.token_ids) for c in chunks) == 5
        assert chunks[-1].finish_reason == "length"
        assert await client.health(timeout=2) == "SERVING"
