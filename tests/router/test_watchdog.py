"""The stall watchdog: a read past its limit on a worker making no progress is cancelled;
a busy worker that still makes progress gets patience, up to a bound."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.router.watchdog import PATIENCE, StallWatchdog

LIMIT = 0.02


async def read(watchdog: StallWatchdog, future: asyncio.Future, limit: float = LIMIT):
    watchdog.reading(limit)
    try:
        return await future
    finally:
        watchdog.done_reading()


async def test_a_read_on_a_worker_without_progress_is_cancelled():
    watchdog = StallWatchdog(lambda: False)
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.CancelledError):
        await read(watchdog, never)
    assert watchdog.fired
    asyncio.current_task().uncancel()


async def test_a_progressing_worker_gets_patience_but_not_forever():
    loop = asyncio.get_running_loop()
    watchdog = StallWatchdog(lambda: True)
    late = loop.create_future()
    loop.call_later(3 * LIMIT, late.set_result, "chunk")  # three limits late, well within patience
    assert await read(watchdog, late) == "chunk"
    assert not watchdog.fired
    never = loop.create_future()
    with pytest.raises(asyncio.CancelledError):
        await read(watchdog, never)
    assert watchdog.fired
    asyncio.current_task().uncancel()
    assert PATIENCE > 3


async def test_time_spent_outside_reads_does_not_count():
    loop = asyncio.get_running_loop()
    watchdog = StallWatchdog(lambda: False)
    for _ in range(3):
        ready = loop.create_future()
        ready.set_result(None)
        await read(watchdog, ready)
        # The consumer is slow (e.g. a client reading slowly): several limits pass between reads.
        pause = loop.create_future()
        loop.call_later(2 * LIMIT, pause.set_result, None)
        await pause
    assert not watchdog.fired
    watchdog.stop()


async def test_stop_disarms_the_timer():
    loop = asyncio.get_running_loop()
    watchdog = StallWatchdog(lambda: False)
    watchdog.reading(LIMIT)
    watchdog.stop()
    later = loop.create_future()
    loop.call_later(3 * LIMIT, later.set_result, None)
    await later  # not cancelled: no timer left
    assert not watchdog.fired
