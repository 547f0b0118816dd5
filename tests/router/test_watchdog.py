"""The stall watchdog: a read past its limit on a worker making no progress is cancelled; a
busy worker that reports progress is never marked stalled, however long the read waits."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.router.watchdog import StallWatchdog

LIMIT = 0.02


async def read(watchdog: StallWatchdog, future: asyncio.Future, limit: float = LIMIT):
    watchdog.reading(limit)
    try:
        return await future
    finally:
        watchdog.done_reading()


async def test_a_read_on_a_worker_without_progress_is_cancelled():
    watchdog = StallWatchdog(lambda limit: False)
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.CancelledError):
        await read(watchdog, never)
    assert watchdog.fired
    asyncio.current_task().uncancel()


async def test_a_busy_worker_that_reports_progress_is_never_marked_stalled():
    """Overload (issue #50): a request queued behind others waits many limits for its first chunk
    while its engine steps. Before, the watchdog gave up after six limits whatever the worker said."""
    loop = asyncio.get_running_loop()
    asked: list[float] = []
    watchdog = StallWatchdog(lambda limit: asked.append(limit) is None)
    late = loop.create_future()
    loop.call_later(20 * LIMIT, late.set_result, "chunk")
    assert await read(watchdog, late) == "chunk"
    assert not watchdog.fired
    assert asked and set(asked) == {LIMIT}  # it asked the worker, with the read's own limit
    watchdog.stop()


async def test_a_worker_that_stops_progressing_is_marked_stalled_at_the_next_look():
    loop = asyncio.get_running_loop()
    progressing = True
    watchdog = StallWatchdog(lambda limit: progressing)
    never = loop.create_future()

    def stop() -> None:
        nonlocal progressing
        progressing = False

    loop.call_later(10 * LIMIT, stop)
    started = loop.time()
    with pytest.raises(asyncio.CancelledError):
        await read(watchdog, never)
    assert watchdog.fired
    assert loop.time() - started >= 10 * LIMIT  # not before the worker stopped progressing
    asyncio.current_task().uncancel()


async def test_time_spent_outside_reads_does_not_count():
    loop = asyncio.get_running_loop()
    watchdog = StallWatchdog(lambda limit: False)
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
    watchdog = StallWatchdog(lambda limit: False)
    watchdog.reading(LIMIT)
    watchdog.stop()
    later = loop.create_future()
    loop.call_later(3 * LIMIT, later.set_result, None)
    await later  # not cancelled: no timer left
    assert not watchdog.fired
