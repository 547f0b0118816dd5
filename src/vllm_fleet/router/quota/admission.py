"""Admission: per-key token buckets and per-class bounded queues, in front of routing.

A key has two buckets, each holding one minute's worth: requests, and tokens. A request
reserves its prompt estimate + max_tokens up front (so a key cannot start a burst of huge
requests), and the reservation is settled with the real usage when it ends (unused tokens
go back; a bucket may go into debt when the estimate was low). Then the request takes a
slot of its workload class ("short" or "long"); when all slots are busy it waits in that
class's queue, up to `queue_timeout_s`; a full queue rejects at once. Every refusal is a
RateLimitedError whose `reason` labels the metric and whose `retry_after` is honest.

Limits can change while the gateway runs (`Admission.update_limits`, on a reload of the keys
file): admitted requests keep their tickets and settle against their key's current bucket;
a bucket whose limit did not change keeps its level, and one whose limit changed keeps what
was used of it, so a reload is never a free refill.

With `--fleet-quota zk://...` the key buckets are the fleet's, shared by every gateway through
leases from ZooKeeper (router/quota/fleet.py); the class queues stay this process's own. Without it,
the processes of one `gateway --processes N` share their key buckets through a mapped file
(router/quota/shared_buckets.py), so a key's limit holds for the gateway, not for each process.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.features import LONG, SHORT
from vllm_fleet.router.quota.key_limiter import KeyLimiter
from vllm_fleet.router.quota.shared_buckets import SharedBucketFile


class KeyQuota(Protocol):
    """Key budgets kept outside this process (FleetQuota, fleet.py), used instead of Admission's
    own KeyLimiter: what Admission calls on them."""

    async def reserve(self, key: str, tokens: int) -> None: ...

    def settle(self, key: str, reserved: int, used: int, *, refund_request: bool = False) -> None: ...

    def update(self, config: AdmissionConfig) -> None: ...


class ClassQueue:
    """At most `max_in_flight` requests of one class at once; up to `queue_size` more wait, FIFO."""

    def __init__(self, name: str, max_in_flight: int | None, queue_size: int) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
        self.queue_size = queue_size
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def depth(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout: float) -> None:
        if self.max_in_flight is None or (self.in_flight < self.max_in_flight and not self._waiters):
            self.in_flight += 1
            return
        if len(self._waiters) >= self.queue_size:
            raise RateLimitedError(
                f"the {self.name} request queue is full ({self.queue_size} waiting); retry shortly",
                retry_after=1.0, reason="queue_full",
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel that lands as the
            # slot is granted, and a caller that has gone would then be served.
            async with asyncio.timeout(timeout):
                await asyncio.shield(waiter)
        except TimeoutError:
            self._give_up(waiter)
            raise RateLimitedError(
                f"waited {timeout:.1f}s in the {self.name} request queue without a free slot; retry shortly",
                retry_after=1.0, reason="queue_timeout",
            ) from None
        except asyncio.CancelledError:
            self._give_up(waiter)
            raise

    def _give_up(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():
            self.release()  # a slot was handed over just as we gave up: pass it on
        else:
            waiter.cancel()
            self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next waiter
                return
        self.in_flight -= 1


class Admission:
    """Key budgets, then a class slot. `admit` returns a Ticket that must be finished once.

    With a `quota` (a KeyQuota: FleetQuota, router/quota/fleet.py), key budgets are the fleet's,
    shared with other gateways, instead of this process's own `keys`."""

    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic, *,
                 quota: KeyQuota | None = None, shared_keys: SharedBucketFile | None = None) -> None:
        self.config = config
        # shared_keys: the key buckets of all processes of one `gateway --processes N`.
        self.keys = KeyLimiter(config, clock, shared_keys)
        self.quota = quota
        if quota is not None:
            quota.update(config)
        self.queues = {
            SHORT: ClassQueue(SHORT, config.short_max_in_flight, config.short_queue_size),
            LONG: ClassQueue(LONG, config.long_max_in_flight, config.long_queue_size),
        }

    async def admit(self, *, key: str | None, workload_class: str, tokens: int, timeout: float | None) -> Ticket:
        limited = key is not None and self.config.limits_keys
        if limited:
            if self.quota is not None:
                await self.quota.reserve(key, tokens)
            else:
                self.keys.reserve(key, tokens)
        queue = self.queues[workload_class]
        wait = self.config.queue_timeout_s if timeout is None else max(0.0, min(timeout, self.config.queue_timeout_s))
        try:
            await queue.acquire(wait)
        except BaseException:
            if limited:
                self.settle(key, tokens, 0, refund_request=True)
            raise
        return Ticket(self, key if limited else None, queue, tokens)

    def update_limits(self, default: KeyLimits, keys: dict[str, KeyLimits]) -> None:
        """New key limits for requests admitted from now on (queues and classes stay as they are).

        Tickets already out keep their class slot and settle their reservation against the key's
        bucket as it is then; see the module docstring on what a change does to a bucket."""
        self.config = self.config.model_copy(update={"default": default, "keys": dict(keys)})
        self.keys.update(self.config)
        if self.quota is not None:
            self.quota.update(self.config)

    def settle(self, key: str, reserved: int, used: int, *, refund_request: bool = False) -> None:
        """Correct `key`'s reservation with the real usage, wherever its budget lives."""
        (self.quota if self.quota is not None else self.keys).settle(key, reserved, used,
                                                                     refund_request=refund_request)


class Ticket:
    """An admitted request: holds its class slot and its key reservation until `finish`."""

    __slots__ = ("_admission", "_key", "_queue", "reserved", "_done")

    def __init__(self, admission: Admission, key: str | None, queue: ClassQueue, reserved: int) -> None:
        self._admission, self._key, self._queue, self.reserved = admission, key, queue, reserved
        self._done = False

    def finish(self, used_tokens: int) -> None:
        """Release the class slot and settle the key's tokens with what was really used."""
        if self._done:
            return
        self._done = True
        self._queue.release()
        if self._key is not None:
            self._admission.settle(self._key, self.reserved, used_tokens)
