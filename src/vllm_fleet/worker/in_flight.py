"""One Generate request in flight on a worker, and how its task waits for its engine's output.

`InFlight` is the worker's record of a request (generate_rpcs.py keeps them by id): the pump
tasks of its inputs, or none where its own task reads a one-input engine stream (`next_direct`),
and how an Abort or a stalled engine reaches that task. `next_event` waits on a pumped request's
queue up to its coalescing deadline. `despite_cancellation` runs a request's cleanup to its end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.worker.request_stream import Ended, Failed, StreamEvent


@dataclass
class InFlight:
    """One request in flight: its pumps, and the engine requests they run (Pool's has none)."""

    tasks: list[asyncio.Task] = field(default_factory=list)
    engine_ids: list[str] = field(default_factory=list)
    aborted: bool = False
    events: asyncio.Queue[StreamEvent] | None = None  # where fail_all() delivers its error
    # A request without pumps (one input, read by its own task; next_direct): an Abort or
    # fail_all() sets `aborted` / `failure` and, while that task waits on the engine, cancels the wait.
    direct: bool = False
    failure: Exception | None = None
    reader: asyncio.Task | None = None
    interrupts: int = 0

    def interrupt(self) -> None:
        if self.reader is not None:
            self.interrupts += 1
            self.reader.cancel()


async def next_event(events: asyncio.Queue[StreamEvent], deadline: float | None,
                     loop: asyncio.AbstractEventLoop) -> StreamEvent | None:
    """The next event of a request's inputs, or None once the coalescing deadline has passed."""
    if deadline is None:
        return await events.get()
    # asyncio.timeout_at, not wait_for: on Python 3.11 wait_for drops a cancel that lands as the
    # event arrives, and the request then runs on for a client that has gone (the abort is lost).
    try:
        async with asyncio.timeout_at(deadline):
            return await events.get()
    except TimeoutError:
        return None


async def next_direct(source: AsyncIterator[StreamEvent], active: InFlight) -> StreamEvent:
    """The next event of a request that reads its engine stream in its own task. An Abort or
    fail_all() that came while the task was elsewhere is seen here; one that comes while it
    waits cancels the wait (which aborts the engine request, as a pump's cancel does) and
    becomes the event a pump would have sent. Any other cancellation goes on up."""
    if active.failure is not None:
        return Failed(0, active.failure)
    if active.aborted:
        return Ended(0, aborted=True)
    task = asyncio.current_task()
    active.reader = task
    try:
        return await anext(source)
    except asyncio.CancelledError:
        ours, active.interrupts = active.interrupts, 0
        for _ in range(ours):
            task.uncancel()
        if not ours or task.cancelling():
            raise
        return Failed(0, active.failure) if active.failure is not None else Ended(0, aborted=True)
    finally:
        active.reader = None


async def despite_cancellation(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run `cleanup` to its end even if the awaiting task is cancelled (once or more) meanwhile;
    such a cancellation is raised once it has ended. Only the loop's own shutdown, which
    cancels every task, stops the cleanup itself."""
    task = asyncio.ensure_future(cleanup)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():  # the cleanup itself was cancelled (the loop shuts down)
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def cancel_pump(active: InFlight, engine_id: str) -> None:
    """Stop one input's pump, which aborts its engine request."""
    if engine_id in active.engine_ids:
        active.tasks[active.engine_ids.index(engine_id)].cancel()
