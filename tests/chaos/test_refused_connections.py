"""Scenario 2: a worker refuses connections before the first token (killed while idle; the
router has not polled it since). Requests fail over transparently: every one succeeds.
Figure: success rate, added P99 TTFT.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from chaos_support import percentile, router_for, text_request
from support import wait_until
from vllm_fleet.router import RouterConfig

pytestmark = pytest.mark.timeout(120)

REQUESTS = 40


async def _ttfts(router, tag: str) -> tuple[list[float], list]:
    async def one(i: int):
        stream = router.stream(text_request(f"{tag}-{i}", f"prompt {i}", 4))
        started, first, finish = time.monotonic(), None, None
        async for chunk in stream:
            first = first or time.monotonic()
            finish = chunk.finish_reason or finish
        assert finish == "length", stream
        return first - started, stream

    results = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    return [t for t, _ in results], [s for _, s in results]


async def test_refused_connections_fail_over_before_the_first_token(workers):
    dead, alive = await workers(2, mock_tokens_per_s=500, mock_ttft_ms=5)
    # Polls far apart: the router learns of the death only from failed requests.
    config = RouterConfig(policy="round_robin", health_poll_interval_s=60, load_poll_interval_s=60,
                          retry_budget_min_per_s=100)
    async with router_for([dead.address, alive.address], config) as router:
        await wait_until(lambda: sum(v.state == "serving" for v in router.snapshot()) == 2, timeout=20,
                         message="both workers serving")
        baseline, _ = await _ttfts(router, "warm")
        dead.kill()
        ttfts, streams = await _ttfts(router, "after")
    failed_over = sum(1 for s in streams if s.attempts > 1)
    assert failed_over > 0, "no request was routed to the dead worker: the scenario did not happen"
    assert all(s.worker == alive.address for s in streams)
    added = percentile(ttfts, 99) - percentile(baseline, 99)
    print(f"\n[figure] refused connections: success {REQUESTS}/{REQUESTS}, {failed_over} failed over, "
          f"added P99 TTFT {added * 1000:.0f} ms (baseline P99 {percentile(baseline, 99) * 1000:.0f} ms)")
