"""Stall detection for one attempt's stream, cheap enough to run on every chunk.

A read that waits past its limit (`first_chunk_timeout_s` for the first chunk,
`stall_timeout_s` after) makes the worker suspect. It is declared stalled only if it also
shows no progress (`Pool.progressing`): it is not SERVING (its own verdict, e.g. a stalled
engine, or no answer), or it produced no output lately. Requests it merely holds are not
progress: a wedged engine reports `running > 0` forever. An overloaded worker still generating
for others is slow, not stuck; moving its streams would only add prefill work to a pool that
is already short of it (a retry storm). A read that waits `PATIENCE` times its limit is
declared stalled whatever the worker says.

One timer per stream, re-armed only when it fires; a chunk costs one clock read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# How many limits a read may wait on a worker that keeps making progress for others.
PATIENCE = 6.0


class StallWatchdog:
    def __init__(self, progressing: Callable[[], bool]) -> None:
        self._progressing = progressing
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self._read_since: float | None = None
        self._limit = 0.0
        self.fired = False

    def reading(self, limit: float) -> None:
        """A read starts now and may take `limit` seconds."""
        now = self._loop.time()
        self._read_since = now
        self._limit = limit
        self._task = asyncio.current_task()
        # Re-arm when the limit shrinks (first chunk → stall limit), else a stream that hangs
        # after its first chunk would wait out the first-chunk limit.
        if self._handle is None or self._handle.when() > now + limit:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(now + limit, self._check)

    def done_reading(self) -> None:
        self._read_since = None

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        now = self._loop.time()
        since = self._read_since
        if since is None:  # not reading (the consumer is busy): look again one limit later
            self._handle = self._loop.call_at(now + self._limit, self._check)
            return
        waited = now - since
        if waited < self._limit:  # a newer read, or the loop ran this a hair early: look at its limit
            self._handle = self._loop.call_at(since + self._limit, self._check)
            return
        if waited < PATIENCE * self._limit and self._progressing():
            self._handle = self._loop.call_at(now + self._limit / 4, self._check)
            return
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    @property
    def waited(self) -> float:
        return 0.0 if self._read_since is None else self._loop.time() - self._read_since
