"""Scenario 5: every worker is down.

Requests fail fast with 503 and a Retry-After header (an OpenAI error body, never a hang or a
500), and the gateway holds nothing per refused request. Figure: P99 time to fail, memory.
"""

from __future__ import annotations

import asyncio
import resource
import time

import httpx
import pytest

from chaos_support import percentile
from support import wait_until

pytestmark = pytest.mark.timeout(120)

REQUESTS = 400


async def test_all_workers_down_fails_fast_with_retry_after(workers, start_gateway):
    pool = await workers(2, mock_tokens_per_s=500)
    server = await start_gateway([w.address for w in pool])
    for worker in pool:
        worker.kill()
    await wait_until(lambda: not server.router.models(), timeout=30, message="the router to see no serving worker")
    body = {"model": "chaos", "messages": [{"role": "user", "content": "anyone?"}], "max_tokens": 5}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        assert (await http.get("/ready")).status_code == 503

        async def one(stream: bool) -> tuple[float, httpx.Response]:
            started = time.monotonic()
            reply = await http.post("/v1/chat/completions", json={**body, "stream": stream})
            return time.monotonic() - started, reply

        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tasks_before = await _gateway_tasks(http)
        results = []
        for batch in range(REQUESTS // 20):
            results += await asyncio.gather(*(one(stream=i % 2 == 0) for i in range(20)))
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Nothing per refused request lives on: the gateway's loop is back to its task count.
        await wait_until(lambda: _at_most(_gateway_tasks(http), tasks_before), timeout=10,
                         message=f"the gateway's asyncio tasks to fall back to {tasks_before}")
    for _, reply in results:
        assert reply.status_code in (503, 404), reply.text  # 404: the model is not known any more
        assert reply.json()["error"]["message"]
        if reply.status_code == 503:
            assert int(reply.headers["retry-after"]) >= 1
    assert sum(v.in_flight for v in server.router.snapshot()) == 0
    statuses = {code: sum(1 for _, r in results if r.status_code == code) for code in (503, 404)}
    p99 = percentile([t for t, _ in results], 99)
    print(f"\n[figure] all workers down: {REQUESTS} requests → {statuses}, P99 time to fail {p99 * 1000:.1f} ms, "
          f"test-process peak RSS {rss_before / 1024:.0f} → {rss_after / 1024:.0f} MB, "
          f"event-loop tasks back to {tasks_before:.0f}")


async def _gateway_tasks(http: httpx.AsyncClient) -> float:
    """The gateway's own gauge of asyncio tasks in its loop (here: the test's loop, which it shares)."""
    text = (await http.get("/metrics")).text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("vllm_fleet_gateway_asyncio_tasks "))


async def _at_most(value, bound: float) -> bool:
    return await value <= bound
