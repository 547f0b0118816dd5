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
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.features import LONG, SHORT
from vllm_fleet.router.quota.shared_buckets import REQUESTS, TOKENS, SharedBucketFile, SharedTokenBucket

if TYPE_CHECKING:
    from vllm_fleet.router.quota.fleet import FleetQuota

# Above this many tracked keys, idle (full) buckets are dropped: they carry no state.
MAX_IDLE_KEYS = 10_000


class TokenBucket:
    def __init__(self, per_min: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = per_min
        self.rate_per_s = per_min / 60.0
        self._clock = clock
        self._level = per_min
        self._updated = clock()

    @property
    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._updated) * self.rate_per_s)
        self._updated = now
        return self._level

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` can be taken (0 if now). A request larger than the whole
        bucket is admitted when the bucket is full, and leaves it in debt."""
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def resized(self, per_min: float) -> TokenBucket:
        """A bucket holding `per_min` that remembers what was used of this one (debt included)."""
        bucket = TokenBucket(per_min, self._clock)
        bucket._level = per_min - (self.capacity - self.level)
        return bucket

    def set_level(self, level: float) -> None:
        """Hold `level` from now on (at most the capacity): where a fallback share starts."""
        self._level = min(self.capacity, level)
        self._updated = self._clock()

    def take(self, amount: float) -> None:
        self._level = self.level - amount

    def give(self, amount: float) -> None:
        self._level = min(self.capacity, self.level + amount)

    @property
    def full(self) -> bool:
        return self.level >= self.capacity


Bucket = TokenBucket | SharedTokenBucket


@dataclass(slots=True)
class _KeyBuckets:
    requests: Bucket | None
    tokens: Bucket | None


class KeyLimiter:
    """Per-key request and token buckets: this process's own, or with `shared` those of every
    process that maps the same SharedBucketFile (each public method holds its lock throughout)."""

    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic,
                 shared: SharedBucketFile | None = None) -> None:
        self.config = config
        self._clock = clock
        self._keys: dict[str, _KeyBuckets] = {}
        self.shared = shared
        self._locked = shared.locked if shared is not None else contextlib.nullcontext

    def _buckets(self, key: str) -> _KeyBuckets:
        buckets = self._keys.get(key)
        if buckets is None:
            if len(self._keys) >= MAX_IDLE_KEYS:
                self._drop_idle()
            buckets = self._keys[key] = self._new_buckets(key, self.config.limits_for(key))
        return buckets

    def _new_buckets(self, key: str, limits: KeyLimits) -> _KeyBuckets:
        slot = None
        if self.shared is not None and (limits.requests_per_min or limits.tokens_per_min):
            slot = self.shared.slot(key, limits.requests_per_min, limits.tokens_per_min, self._clock())
        if slot is None:
            return _KeyBuckets(
                TokenBucket(limits.requests_per_min, self._clock) if limits.requests_per_min else None,
                TokenBucket(limits.tokens_per_min, self._clock) if limits.tokens_per_min else None,
            )
        return _KeyBuckets(
            SharedTokenBucket.started(self.shared, slot, REQUESTS, limits.requests_per_min, self._clock)
            if limits.requests_per_min else None,
            SharedTokenBucket.started(self.shared, slot, TOKENS, limits.tokens_per_min, self._clock)
            if limits.tokens_per_min else None,
        )

    def update(self, config: AdmissionConfig) -> None:
        """Use the limits of `config` from now on; only buckets whose limits changed are rebuilt."""
        with self._locked():
            old, self.config = self.config, config
            for key, buckets in self._keys.items():
                limits = config.limits_for(key)
                if limits == old.limits_for(key):
                    continue
                buckets.requests = self._resized(key, buckets.requests, limits.requests_per_min, REQUESTS)
                buckets.tokens = self._resized(key, buckets.tokens, limits.tokens_per_min, TOKENS)

    def _resized(self, key: str, bucket: Bucket | None, per_min: float | None, which: int) -> Bucket | None:
        if not per_min:
            return None
        if bucket is not None:
            return bucket.resized(per_min)
        # The key had this limit off: the bucket starts full, as a new key's would.
        slot = self.shared.slot(key, None, None, self._clock()) if self.shared is not None else None
        if slot is None:
            return TokenBucket(per_min, self._clock)
        return SharedTokenBucket.started(self.shared, slot, which, per_min, self._clock)

    def start_at(self, key: str, requests: float, tokens: float) -> None:
        """Set `key`'s bucket levels (the fleet quota's fallback starts a key where the fleet left it)."""
        with self._locked():
            buckets = self._buckets(key)
            if buckets.requests is not None:
                buckets.requests.set_level(requests)
            if buckets.tokens is not None:
                buckets.tokens.set_level(tokens)

    def reserve(self, key: str, tokens: int) -> None:
        """Take one request and `tokens` from `key`'s buckets, or raise RateLimitedError."""
        with self._locked():
            self._reserve(key, tokens)

    def _reserve(self, key: str, tokens: int) -> None:
        buckets = self._buckets(key)
        if buckets.requests is not None and (wait := buckets.requests.wait_for(1)) > 0:
            raise RateLimitedError(
                f"key {key_label(key)} is over its limit of {buckets.requests.capacity:g} requests per minute",
                retry_after=wait, reason="requests_per_min",
            )
        if buckets.tokens is not None and (wait := buckets.tokens.wait_for(tokens)) > 0:
            raise RateLimitedError(
                f"key {key_label(key)} is over its limit of {buckets.tokens.capacity:g} tokens per minute "
                f"(this request reserves {tokens}: prompt estimate + max_tokens; lower max_tokens to fit)",
                retry_after=wait, reason="tokens_per_min",
            )
        if buckets.requests is not None:
            buckets.requests.take(1)
        if buckets.tokens is not None:
            buckets.tokens.take(tokens)

    def settle(self, key: str, reserved: int, used: int, *, refund_request: bool = False) -> None:
        """Correct a reservation with the real usage (or return it all if nothing ran)."""
        with self._locked():
            self._settle(key, reserved, used, refund_request)

    def _settle(self, key: str, reserved: int, used: int, refund_request: bool) -> None:
        buckets = self._keys.get(key)
        if buckets is None:
            return
        if buckets.tokens is not None:
            if used < reserved:
                buckets.tokens.give(reserved - used)
            elif used > reserved:
                buckets.tokens.take(used - reserved)
        if refund_request and buckets.requests is not None:
            buckets.requests.give(1)

    def _drop_idle(self) -> None:
        for key in [k for k, b in self._keys.items() if all(x is None or x.full for x in (b.requests, b.tokens))]:
            del self._keys[key]


def key_label(key: str) -> str:
    # Keys are secrets; errors and logs name only their start.
    return repr(key[:6] + "…") if len(key) > 8 else repr(key)


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

    With a `quota` (router/quota/fleet.py), key budgets are the fleet's, shared with other gateways,
    instead of this process's own `keys`."""

    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.monotonic, *,
                 quota: FleetQuota | None = None, shared_keys: SharedBucketFile | None = None) -> None:
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
