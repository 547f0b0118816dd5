"""A hung engine among busy ones (issue #50): both workers queue far more than their slots while
one engine stops stepping. The busy worker's queued streams wait however long; the hung one's
are caught by its worker (no step, no CPU: its engine watch fails what it holds) and move to the
busy one. Every stream ends whole; none of the busy worker's was moved.
"""

from __future__ import annotations

import asyncio

import pytest

from chaos_support import collect, router_for, text_request
from support import wait_until
from vllm_fleet.router import RouterConfig

pytestmark = pytest.mark.timeout(120)

STREAMS = 16
TOKENS = 40


async def test_a_hung_engine_among_busy_ones_is_caught_and_only_its_streams_move(workers, tmp_path):
    stall = tmp_path / "stall"
    (victim,), (busy,) = await asyncio.gather(
        workers(1, mock_tokens_per_s=40, mock_ttft_ms=5, max_num_seqs=2, mock_stall_file=str(stall)),
        workers(1, mock_tokens_per_s=40, mock_ttft_ms=5, max_num_seqs=2))
    # Stall limits far below the queueing each stream sees (up to ~7 s behind 2 slots).
    config = RouterConfig(policy="round_robin", stall_timeout_s=1.0, first_chunk_timeout_s=1.0,
                          health_poll_interval_s=0.5, load_poll_interval_s=0.25)
    async with router_for([victim.address, busy.address], config) as router:
        await wait_until(lambda: len(router.snapshot().eligible()) == 2, timeout=20, message="both workers serving")
        firsts = [asyncio.Event() for _ in range(STREAMS)]
        streams = [router.stream(text_request(f"queued-{i}", f"prompt {i}", TOKENS)) for i in range(STREAMS)]
        tasks = [asyncio.ensure_future(collect(s, first)) for s, first in zip(streams, firsts)]
        await wait_until(lambda: sum(f.is_set() for f in firsts) >= 4, timeout=20, message="both engines decoding")
        on_victim = [s for s in streams if s.worker == victim.address]
        assert on_victim, "round robin sent nothing to the victim"
        stall.touch()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), timeout=90)
    assert all(finish == "length" for _, finish in answers), answers
    assert all(s.worker == busy.address for s in streams), [repr(s) for s in streams]
    assert all(s.attempts >= 2 for s in on_victim)
    moved_off_busy = [s for s in streams if s not in on_victim and s.attempts > 1]
    assert moved_off_busy == [], [repr(s) for s in moved_off_busy]
