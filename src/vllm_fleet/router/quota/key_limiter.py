"""Per-key request and token buckets in this process (KeyLimiter), each bucket one minute's worth.

A key has two buckets: requests, and tokens. A request reserves its prompt estimate + max_tokens
up front, and the reservation is settled with the real usage when it ends (admission.py says
why). The buckets are this process's own (TokenBucket), or with a SharedBucketFile those every
process of one `gateway --processes N` maps (shared_buckets.py). The fleet quota (fleet.py)
falls back to one of these when ZooKeeper does not answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.quota.shared_buckets import REQUESTS, TOKENS, SharedBucketFile, SharedTokenBucket

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
