"""A client that goes away mid-request frees the worker: its engine request is aborted."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from support import wait_until
from vllm_fleet.client import WorkerClient


@pytest.fixture(scope="module")
async def slow_worker(module_mock_workers):
    """Both cases' worker: each leaves it with nothing running, which it asserts."""
    return await module_mock_workers.start(served_model_name="slow", mock_tokens_per_s=20, mock_ttft_ms=1)


@pytest.fixture
async def slow(start_gateway, slow_worker):
    worker = slow_worker
    server = await start_gateway([worker.address])
    client = WorkerClient(worker.address)
    yield server, client
    await client.close()


async def running(client: WorkerClient) -> int:
    return (await client.load()).running


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_aborts_the_worker_request(slow, stream):
    server, worker = slow
    body = {"model": "slow", "prompt": "go on", "max_tokens": 2000, "stream": stream}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        if stream:
            async with http.stream("POST", "/v1/completions", json=body) as reply:
                assert reply.status_code == 200
                lines = reply.aiter_lines()  # keep a reference: a collected iterator closes the stream
                first = await anext(lines)
                assert first.startswith("data: ") and "error" not in first, first
                await wait_until(lambda: running(worker), timeout=10, message="the worker to run the request")
            # Leaving the block closed the connection mid-stream.
        else:
            waiting = asyncio.ensure_future(http.post("/v1/completions", json=body))
            await wait_until(lambda: running(worker), timeout=10, message="the worker to run the request")
            waiting.cancel()  # drops the connection while the gateway waits for the whole answer
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    await wait_until(lambda: _idle(worker), timeout=10, message="the worker to have nothing running")
    await wait_until(lambda: sum(w.in_flight for w in server.router.snapshot()) == 0, timeout=10,
                     message="the router to have nothing in flight")


async def _idle(worker: WorkerClient) -> bool:
    return await running(worker) == 0


async def test_worker_dying_mid_stream_becomes_an_error_event(start_gateway, mock_worker_factory):
    """With no other worker to migrate to, the stream ends with an SSE error event, then [DONE]."""
    worker = await mock_worker_factory.start(served_model_name="doomed", mock_tokens_per_s=20, mock_ttft_ms=1)
    server = await start_gateway([worker.address])
    body = {"model": "doomed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "stream": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            lines = reply.aiter_lines()
            assert "chat.completion.chunk" in await anext(lines)
            worker.kill()
            events = [line async for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: "):])["error"]
    assert error["message"] and error["type"] in ("upstream_error", "service_unavailable")
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200
