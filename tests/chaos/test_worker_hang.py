"""Scenario 3: a worker hangs with its process alive (SIGSTOP).

The router must notice (health polls time out), migrate the streams it held, and send it
nothing new once it has noticed. Figure: detection time, requests sent after detection.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from chaos_support import collect, router_for, text_request
from support import wait_until
from vllm_fleet.router import RouterConfig

pytestmark = pytest.mark.timeout(120)


async def test_sigstopped_worker_is_detected_and_avoided(workers):
    victim, healthy = await workers(2, mock_tokens_per_s=40, mock_ttft_ms=5)
    # A first-chunk limit far beyond the test timeout: the hung streams must be moved on the
    # stall limit, not on the first-chunk one (they had their first chunk).
    config = RouterConfig(policy="round_robin", health_poll_interval_s=0.5, stall_timeout_s=2.0,
                          first_chunk_timeout_s=600)
    async with router_for([victim.address, healthy.address], config) as router:
        await wait_until(lambda: len(router.models()) == 1 and all(v.state == "serving" for v in router.snapshot()),
                         timeout=20, message="both workers serving")
        firsts = [asyncio.Event() for _ in range(8)]
        in_flight = [asyncio.ensure_future(collect(router.stream(text_request(f"before-{i}", f"p{i}", 40)), first))
                     for i, first in enumerate(firsts)]
        await wait_until(lambda: all(f.is_set() for f in firsts), timeout=20, message="every stream's first chunk")
        assert not any(t.done() for t in in_flight), "streams finished before the fault: make them longer"
        assert router.snapshot().get(victim.address).in_flight > 0, "the victim holds no stream"
        victim.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            await wait_until(lambda: router.snapshot().get(victim.address).state != "serving", timeout=30,
                             message="the router to notice the hung worker")
            detection_s = time.monotonic() - stopped_at
            streams = [router.stream(text_request(f"after-{i}", f"q{i}", 5)) for i in range(20)]
            answers = await asyncio.gather(*(collect(s) for s in streams))
            sent_after = sum(1 for s in streams if s.worker == victim.address or s.attempts > 1)
            assert sent_after == 0, [repr(s) for s in streams if s.worker == victim.address or s.attempts > 1]
            assert all(finish == "length" for _, finish in answers)
            before = await asyncio.gather(*in_flight)
            assert all(finish == "length" for _, finish in before), before
        finally:
            victim.signal(signal.SIGCONT)
    print(f"\n[figure] SIGSTOP: detection {detection_s * 1000:.0f} ms (health poll 0.5 s), "
          f"requests sent to it after detection {sent_after}/20, its 8 in-flight streams migrated")


async def test_streams_leave_a_worker_whose_engine_stalls_even_if_it_stays_serving(workers, tmp_path):
    """The worker's own stall check is off: it stays SERVING and its Load keeps reporting the
    requests it holds. It also reports its engine's silence, so the router's watchdog moves the
    streams soon after the stall limit, though the worker never declares the stall itself."""
    stall_file = tmp_path / "stall"
    # 400 tokens at 80/s: the streams outlast the stall and finish ~5 s after they move.
    (victim,), (healthy,) = await asyncio.gather(
        workers(1, mock_tokens_per_s=80, mock_ttft_ms=5, mock_stall_file=str(stall_file), no_engine_stall_check=True),
        workers(1, mock_tokens_per_s=80, mock_ttft_ms=5))
    stall_limit = 5.0
    config = RouterConfig(policy="round_robin", health_poll_interval_s=0.5, load_poll_interval_s=0.5,
                          stall_timeout_s=stall_limit, first_chunk_timeout_s=600)
    async with router_for([victim.address, healthy.address], config) as router:
        await wait_until(lambda: len(router.snapshot().eligible()) == 2, timeout=20, message="both workers serving")
        firsts = [asyncio.Event() for _ in range(8)]
        streams = [router.stream(text_request(f"held-{i}", f"p{i}", 400)) for i in range(8)]
        in_flight = [asyncio.ensure_future(collect(s, first)) for s, first in zip(streams, firsts)]
        await wait_until(lambda: all(f.is_set() for f in firsts), timeout=20, message="every stream's first chunk")
        stall_file.touch()
        # The limit, then the worker's next Loads showing its engine silent that long: well within 3 limits.
        await wait_until(lambda: all(t.done() for t in in_flight), timeout=3 * stall_limit,
                         message="every stream finished elsewhere")
        answers = [t.result() for t in in_flight]
        assert router.snapshot().get(victim.address).state == "serving"  # it never said otherwise
    assert all(finish == "length" for _, finish in answers)
    assert sum(s.migrations for s in streams) >= 4
    stall_file.unlink()
