"""Stall detection for one attempt's stream, cheap enough to run on every chunk.

A read that waits past its limit (`first_chunk_timeout_s` for the first chunk, `stall_timeout_s`
after) asks whether the worker still progresses (`Pool.progressing(address, limit)`): it is SERVING
(or draining) and its engine has not been silent for the limit by the worker's own account (no
output to any request and no CPU used by its processes, WorkerLoad.engine_silent_s). Only a worker
that fails that is stalled. The wait alone never decides: a request queued behind busy work on an
overloaded engine waits as long as that engine steps, as it would behind stock `vllm serve`, and
moving it would only add prefill to a pool already short of it (a retry storm that then ejects
healthy workers, issue #50). A stopped worker process stops answering its health checks, and a
stopped engine stops stepping; either fails the check within a quarter limit of the next look.

One timer per stream, re-armed only when it fires; a chunk costs one clock read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# How often a read past its limit looks at the worker's progress again: a quarter limit, at most
# a second apart (a worker that stops while a long first-chunk limit runs is noticed within one).
RECHECK = 0.25
RECHECK_MAX_S = 1.0


class StallWatchdog:
    def __init__(self, progressing: Callable[[float], bool]) -> None:
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
        if self._progressing(self._limit):
            self._handle = self._loop.call_at(now + min(RECHECK * self._limit, RECHECK_MAX_S), self._check)
            return
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    @property
    def waited(self) -> float:
        return 0.0 if self._read_since is None else self._loop.time() - self._read_since
