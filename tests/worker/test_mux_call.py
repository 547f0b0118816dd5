"""MuxCall, one GenerateMany call on the worker: when its Load goes out, and what ends its streams.

The clock is moved by hand, so each test says exactly when a timer fires (none of them sleeps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from support import wait_until
from vllm_fleet.protocol.types import WorkerLoad
from vllm_fleet.worker.mux import MUX_LOAD_INTERVAL_S, MuxCall


class _Timer:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _HandClock:
    """A clock that moves only when the test says: its timers fire in `advance` and `fire_early`."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> _Timer:
        timer = _Timer(when, callback)
        self._timers.append(timer)
        return timer

    def armed(self) -> list[float]:
        """When each timer still to fire is due."""
        return [t.when for t in self._timers if not t.cancelled]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._fire(lambda t: t.when <= self.now)

    def fire_early(self) -> None:
        """Fire every timer now, before it is due, as a loop's timer may by a hair."""
        self._fire(lambda t: True)

    def _fire(self, due: Callable[[_Timer], bool]) -> None:
        firing = [t for t in self._timers if not t.cancelled and due(t)]
        self._timers = [t for t in self._timers if t not in firing]
        for timer in firing:
            timer.callback()


def _call(clock: _HandClock) -> MuxCall:
    return MuxCall(lambda: WorkerLoad(running=3, health="SERVING"), clock)


async def _next(call: MuxCall):
    return await asyncio.wait_for(call.next_response(), 5)


async def test_an_idle_call_pushes_loads_from_one_timer_armed_only_when_a_load_goes_out():
    clock = _HandClock()
    call = _call(clock)
    call.push_loads_every(0.05)
    first = await _next(call)  # at once: it tells the client that Loads will come
    assert first.load.running == 3 and first.load_every_ms == 50 and not first.events
    assert clock.armed() == pytest.approx([1000.05])

    clock.advance(0.05)  # the timer fires with no one taking: nothing is armed in its place
    assert clock.armed() == []
    second = await _next(call)
    assert second.load.health == "SERVING" and not second.events
    assert clock.armed() == pytest.approx([1000.10])  # re-armed as that Load went out


async def test_a_timer_that_fires_early_sends_nothing_and_is_armed_again_for_the_same_time():
    clock = _HandClock()
    call = _call(clock)
    call.push_loads_every(0.05)
    await _next(call)
    waiting = asyncio.create_task(call.next_response())
    try:
        clock.fire_early()
        await wait_until(lambda: clock.armed() == pytest.approx([1000.05]), timeout=5, message="the timer armed again")
        assert not waiting.done(), "a message went out with nothing in it"
        clock.advance(0.05)
        response = await asyncio.wait_for(waiting, 5)
        assert response.load.running == 3
    finally:
        waiting.cancel()


async def test_events_carry_a_load_every_interval_and_arm_no_timer_unless_asked():
    clock = _HandClock()
    call = _call(clock)
    call.outbox.end(1)
    first = await _next(call)
    assert [e.stream for e in first.events] == [1] and first.HasField("load")  # the call's first message
    assert first.load_every_ms == 0
    call.outbox.end(2)
    assert not (await _next(call)).HasField("load")  # not due yet
    clock.advance(MUX_LOAD_INTERVAL_S)
    call.outbox.end(3)
    assert (await _next(call)).HasField("load")
    assert clock.armed() == []  # events bring Loads along; an idle call that did not ask gets none


async def test_the_call_ends_when_the_client_is_done_and_its_streams_have_ended():
    call = _call(_HandClock())
    release = asyncio.Event()

    async def stream() -> None:
        await release.wait()
        call.outbox.end(7)

    call.start(7, stream())
    assert call.is_open(7)
    ending = asyncio.create_task(call.requests_ended())
    release.set()
    await asyncio.wait_for(ending, 5)
    assert [e.stream for e in (await _next(call)).events] == [7]
    assert await _next(call) is None


async def test_closing_the_call_cancels_its_streams_and_its_timer():
    clock = _HandClock()
    call = _call(clock)
    call.push_loads_every(0.05)
    await _next(call)
    forever = asyncio.Event()
    call.start(1, forever.wait())
    await asyncio.wait_for(call.close(), 5)
    await wait_until(lambda: not call.is_open(1), timeout=5, message="the stream left the call")
    assert clock.armed() == []
