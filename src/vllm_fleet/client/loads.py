"""One worker's Load and health from whichever route brings them (`WorkerClient.loads()`).

A worker's state reaches a router by four routes: Loads it pushes on an idle GenerateMany call
once asked (MuxRequest.load_every_ms), Loads it attaches to a busy one, the unary Load call, and
the gRPC health check. A unary call costs the gateway about a millisecond of CPU (2-core VM), a
message on an open call a fraction of that. Which route wins is decided here and nowhere else:

- Pushed first. A worker whose newest health is SERVING is asked to push its Load every interval;
  once it says it does, each pushed Load is taken as it comes. It carries the health status, so
  nothing is polled: an idle gateway makes no unary calls. A worker that is not SERVING is not
  asked: a stream call to one that is down would fail anew every turn.
- Pushes that stop make a poll. No push for PUSH_MISSES intervals (plus a Load call's time) makes
  that turn a poll, and so does a worker that no longer says it pushes (an older one took its
  place, its call broke): it is polled every interval, as a worker that predates pushes is.
- A poll takes a Load the worker attached to a stream call since the last turn, else makes a Load
  call. A Load that carries health stands for the health check.
- The health service is asked after a poll's Load that did not carry health (the worker predates
  the field) or got no answer, when the newest health known is older than `health_every_s`; at
  most once a turn, so never oftener than a Load is due. It is asked at once when the caller sets
  `check` (a request to the worker failed), whatever came lately, and its answer then wins over
  the Load's, since the Load's word is what the failure put in doubt.
- Newest wins: every Load yielded carries the newest health known. A poll whose Load call got no
  answer yields `WorkerLoad(health=...)` only when the health service was asked and the worker is
  not SERVING; a serving worker's last Load stands, since an empty Load would draw traffic to the
  worker that cannot answer one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Protocol

from vllm_fleet.errors import FleetError
from vllm_fleet.protocol.types import WorkerLoad

# Intervals without a pushed Load before the turn is a poll: one late push on a busy worker is
# no reason to poll, two are.
PUSH_MISSES = 2


def answer_timeout(interval_s: float) -> float:
    """How long a unary call asked every `interval_s` waits: two intervals, within 0.5-2 s, so a
    CPU-starved worker that answers late still counts, and a dead one is seen within 2 s."""
    return max(0.5, min(2.0, 2 * interval_s))


def late_after(every_s: float) -> float:
    """How long after the last Load the next one, due every `every_s`, is late."""
    return PUSH_MISSES * every_s + answer_timeout(every_s)


class LoadRoutes(Protocol):
    """The routes a feed reads: WorkerClient's, or a test double's."""

    async def load(self, *, timeout: float) -> WorkerLoad: ...
    async def health(self, *, timeout: float) -> str: ...
    def pushes_load(self, every_s: float) -> bool: ...
    async def next_pushed_load(self, timeout: float) -> WorkerLoad | None: ...
    def take_streamed_load(self) -> WorkerLoad | None: ...


class LoadFeed:
    """The rule in the module doc, over one worker's routes; `loads()` is its iterator."""

    def __init__(self, routes: LoadRoutes, every_s: float, *, health_every_s: float,
                 check: asyncio.Event | None = None) -> None:
        self._routes = routes
        self._every_s = every_s
        self._health_every_s = health_every_s
        self._check = check if check is not None else asyncio.Event()
        self.health = "UNKNOWN"              # the newest health status known
        self._health_at = float("-inf")      # loop time it came

    async def loads(self) -> AsyncIterator[WorkerLoad]:
        while True:
            pushed = await self._next_push() if self._pushing() else None
            if pushed is not None and pushed.health and not self._check.is_set():
                self._heard(pushed.health)
                yield pushed
                continue
            load = await self._poll(pushed)
            if load is not None:
                yield load
            if pushed is None:  # a pushed Load's pace is the worker's; a poll's is ours
                await self._rest()

    def _pushing(self) -> bool:
        return self.health == "SERVING" and self._routes.pushes_load(self._every_s)

    async def _next_push(self) -> WorkerLoad | None:
        """The next pushed Load; None when it is late, or a check is asked first."""
        if self._check.is_set():
            return None
        pushed = asyncio.ensure_future(self._routes.next_pushed_load(timeout=late_after(self._every_s)))
        checked = asyncio.ensure_future(self._check.wait())
        try:
            await asyncio.wait((pushed, checked), return_when=asyncio.FIRST_COMPLETED)
        finally:
            pushed.cancel()
            checked.cancel()
        return pushed.result() if pushed.done() and not pushed.cancelled() else None

    async def _poll(self, answered: WorkerLoad | None) -> WorkerLoad | None:
        """One poll turn (see the module doc); `answered`: a Load already in hand."""
        checked = self._check.is_set()
        self._check.clear()  # before asking, so that a failure reported meanwhile asks again
        # Asked alongside the Load call: a failed request's check waits one timeout, not two.
        checking = asyncio.ensure_future(self._ask_health()) if checked else None
        try:
            load = answered or self._routes.take_streamed_load() or await self._load_call()
            if checking is not None:
                status = await checking
            elif load is not None and load.health:
                status = load.health
            elif asyncio.get_running_loop().time() - self._health_at >= self._health_every_s:
                status = await self._ask_health()
            elif load is None:
                return None  # nothing new: its health was heard within `health_every_s`
            else:
                return dataclasses.replace(load, health=self.health)  # heard within `health_every_s`
        finally:
            if checking is not None:
                checking.cancel()
        self._heard(status)
        if load is None:
            return None if status == "SERVING" else WorkerLoad(health=status)
        return load if load.health == status else dataclasses.replace(load, health=status)

    async def _load_call(self) -> WorkerLoad | None:
        try:
            return await self._routes.load(timeout=answer_timeout(self._every_s))
        except FleetError:
            return None  # whether the worker is down is the health service's word

    async def _ask_health(self) -> str:
        return await self._routes.health(timeout=answer_timeout(self._health_every_s))

    def _heard(self, status: str) -> None:
        self.health = status
        self._health_at = asyncio.get_running_loop().time()

    async def _rest(self) -> None:
        """One interval, or less if a check is asked meanwhile."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel that arrives as
        # the event is set (report() of a failure just before close()), and the feed then
        # outlives its pool, so Router.close() never returns.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._every_s):
                await self._check.wait()
