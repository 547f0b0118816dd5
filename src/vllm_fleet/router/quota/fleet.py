"""Per-key quotas that hold for the whole fleet: every gateway spends one shared bucket per key.

Why ZooKeeper: the fleet already runs it for membership, so fleet-wide quotas need no new
service to deploy, secure and watch. It gives what a quota needs to be exact: linearizable
compare-and-set on a znode (a versioned `set`), ephemeral nodes that count the live gateways
without a heartbeat protocol of ours, and session events that say at once when the gateway
is cut off. Its weakness is write cost (every write goes through the leader and a quorum,
milliseconds each), so no request waits for ZooKeeper in the common case: gateways lease.
A Redis counter would be cheaper per operation but is one more stateful service, and its
asynchronous replication can lose increments on failover, i.e. over-admit.

Leases. The shared state of a key is the token bucket a single gateway keeps (one minute's
worth, refilled at limit/60 per second; quota_bucket.py), stored in one znode
(quota_store.py). A gateway takes a *lease* from it — a chunk of requests and tokens — and
admits locally from that balance, with no round trip; when the balance runs low it leases
the next chunk in the background, ahead of need. Settling a request with its real usage
moves the local balance (unused tokens back, overruns as debt), and a balance idle for
`idle_return_s` goes back to the shared bucket. A lease is what the request at hand misses
(debt included) plus a chunk of `lease_fraction` × limit / gateways (at least one request), so:

- over-admission: none while ZooKeeper answers — a gateway only admits what it leased;
- under-admission: at most what the other gateways hold unspent, about `lease_fraction` of
  the limit (10 % by default), and only until their idle leases go back;
- ZooKeeper load: about 1/`lease_fraction` leases per key per minute per busy gateway.

Only the first request of a key on a gateway (or one that outruns the prefetch) waits for a
lease, at most `lease_wait_s`. A key found empty is refused locally, with the Retry-After the
shared bucket gives, until then — no round trip per refused request either.

Fallback. When ZooKeeper does not answer (session suspended or lost, or a lease past its
deadline), each gateway admits from local buckets holding its *share*: limit / N, with N the
gateways last seen in ZooKeeper, starting from its share of the shared level last seen plus
its unspent lease (a key it never leased starts at a full share). It logs a warning and sets
`vllm_fleet_quota_fallback` to 1. While every gateway is cut off alike the fleet admits about
the limit; a gateway cut off alone admits its share on top of what the others lease. When
the session returns, what each gateway admitted in fallback (up to its share) is charged to
the shared bucket as debt, and leasing resumes.

Measured (tests/gateway/test_fleet_quota.py, two gateway processes, 2-core machine, 2026-12-01):
a 60/min key hit with 120 requests over both gateways in 0.6 s admitted exactly 60; cut off
from ZooKeeper, each gateway admitted exactly 30 of 60 and answered the rest 429, no 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.quota.key_limiter import KeyLimiter, key_label
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.quota.bucket import DIMENSIONS, Amount, Lease, give_back, lease
from vllm_fleet.router.quota.metrics import QuotaMetrics
from vllm_fleet.router.quota.store import QuotaStoreUnavailable, ZooKeeperQuotaStore

logger = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_S = 1.0
CLOSE_RETURN_TIMEOUT_S = 5.0   # a stop never waits long on ZooKeeper; an unreturned lease only refills


@dataclass
class _KeyState:
    """One key on this gateway: the leased balance (negative: debt) and when it is refused."""

    limits: KeyLimits
    requests: float = 0.0
    tokens: float = 0.0
    last_used: float = 0.0
    blocked_until: float = 0.0
    blocked: Lease | None = None
    levels: Amount | None = None            # the shared levels last seen
    refill: asyncio.Task | None = None
    fallback_spent: Amount = field(default_factory=Amount)

    def covers(self, need: Amount) -> bool:
        return self.requests >= need.requests and self.tokens >= need.tokens

    def add(self, amount: Amount, sign: float = 1.0) -> None:
        self.requests += sign * amount.requests
        self.tokens += sign * amount.tokens


class FleetQuota:
    """Per-key limits shared by all gateways of one store. Use inside one event loop.

    `reserve` and `settle` are what Admission calls instead of its own KeyLimiter's."""

    def __init__(self, store: ZooKeeperQuotaStore, *, lease_fraction: float = 0.1, lease_wait_s: float = 1.0,
                 idle_return_s: float = 10.0, metrics_registry=None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.lease_fraction = lease_fraction
        self.lease_wait_s = lease_wait_s
        self.idle_return_s = idle_return_s
        self._clock, self._wall = clock, wall
        self._metrics = QuotaMetrics.for_registry(metrics_registry)
        self._config = AdmissionConfig()
        self._keys: dict[str, _KeyState] = {}
        self._gateways = 1
        self._local: KeyLimiter | None = None   # set while in fallback
        self._task: asyncio.Task | None = None
        self._closing = False

    @property
    def in_fallback(self) -> bool:
        return self._local is not None

    @property
    def gateways(self) -> int:
        return self._gateways

    async def start(self) -> None:
        await self.store.start(self._set_connected, self._set_gateways)
        self._task = asyncio.create_task(self._maintain())

    async def close(self) -> None:
        """Give unspent leases back (bounded wait), then leave ZooKeeper."""
        self._closing = True  # the session ending now is no outage
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.in_fallback:
            try:
                await asyncio.wait_for(self._return_idle(all_keys=True), CLOSE_RETURN_TIMEOUT_S)
            except (TimeoutError, QuotaStoreUnavailable) as exc:
                logger.warning("fleet quota: unspent leases not returned on close (%s); they refill within a minute",
                               type(exc).__name__)
        await self.store.close()

    def update(self, config: AdmissionConfig) -> None:
        """New limits (a reload): balances already leased stay; the next leases use them."""
        self._config = config
        for key, state in self._keys.items():
            limits = config.limits_for(key)
            if limits != state.limits:
                state.limits, state.blocked_until = limits, 0.0  # an old refusal says nothing of the new limit
        if self._local is not None:
            self._local.update(_shares(config, self._gateways))

    # -- admission ---------------------------------------------------------------------------

    async def reserve(self, key: str, tokens: int) -> None:
        """Take one request and `tokens` for `key`, or raise RateLimitedError."""
        limits = self._config.limits_for(key)
        need = Amount(1.0 if limits.requests_per_min else 0.0, float(tokens) if limits.tokens_per_min else 0.0)
        if not (need.requests or need.tokens):
            return
        state = self._state(key, limits)
        deadline = self._clock() + self.lease_wait_s
        while self._local is None:
            if state.covers(need):
                state.add(need, -1.0)
                state.last_used = self._clock()
                self._prefetch(key, state, need)
                return
            if (wait := state.blocked_until - self._clock()) > 0:
                raise _refusal(key, limits, state.blocked, wait)
            try:
                await asyncio.wait_for(asyncio.shield(self._refill(key, state, need)), deadline - self._clock())
            except (TimeoutError, QuotaStoreUnavailable) as exc:
                self._enter_fallback(f"a lease for key {key_label(key)} failed ({type(exc).__name__})")
        self._local.reserve(key, tokens)
        state.fallback_spent = Amount(state.fallback_spent.requests + need.requests,
                                      state.fallback_spent.tokens + need.tokens)

    def settle(self, key: str, reserved: int, used: int, *, refund_request: bool = False) -> None:
        """Correct a reservation with the real usage (or return it all if nothing ran)."""
        state = self._keys.get(key)
        if self._local is not None:
            self._local.settle(key, reserved, used, refund_request=refund_request)
            if state is not None:
                spent = state.fallback_spent
                state.fallback_spent = Amount(spent.requests - (1 if refund_request else 0),
                                              spent.tokens + used - reserved)
            return
        if state is None:
            return
        if state.limits.tokens_per_min:
            state.tokens += reserved - used   # unused tokens back; an overrun is debt
        if refund_request and state.limits.requests_per_min:
            state.requests += 1

    # -- leases --------------------------------------------------------------------------------

    def _state(self, key: str, limits: KeyLimits) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState(limits, last_used=self._clock())
        return state

    def _chunk(self, limits: KeyLimits) -> Amount:
        """What to lease beyond what is missing: a share of the limit small enough that what the
        other gateways hold unspent stays under `lease_fraction` of it (at least one request)."""
        sizes = {}
        for name, limit_field in DIMENSIONS:
            limit = getattr(limits, limit_field)
            sizes[name] = self.lease_fraction * limit / self._gateways if limit else 0.0
        return Amount(max(1.0, sizes["requests"]) if limits.requests_per_min else 0.0, sizes["tokens"])

    def _prefetch(self, key: str, state: _KeyState, need: Amount) -> None:
        """Lease ahead, in the background, once the balance would not cover another request
        like this one or falls under half a chunk."""
        chunk = self._chunk(state.limits)
        low = (not state.covers(need) or state.requests < chunk.requests / 2 or state.tokens < chunk.tokens / 2)
        if low and state.blocked_until <= self._clock():
            self._refill(key, state, need)

    def _refill(self, key: str, state: _KeyState, need: Amount, *, ahead: bool = True) -> asyncio.Task:
        """The key's lease in flight (one at a time; concurrent requests share it)."""
        if state.refill is None or state.refill.done():
            state.refill = asyncio.create_task(self._lease(key, state, need, ahead=ahead))
            state.refill.add_done_callback(self._after_lease)
        return state.refill

    def _after_lease(self, task: asyncio.Task) -> None:
        """A lease nobody waits for (a prefetch) that failed still switches to the fallback."""
        if task.cancelled() or (exc := task.exception()) is None:
            return
        if isinstance(exc, QuotaStoreUnavailable):
            self._enter_fallback(f"a lease failed ({exc})")
        else:
            logger.error("fleet quota: a lease failed: %r", exc)

    async def _lease(self, key: str, state: _KeyState, need: Amount, *, ahead: bool = True) -> None:
        """Lease what `need` misses from the balance (debt included), plus a chunk if `ahead`."""
        missing = Amount(max(0.0, need.requests - state.requests), max(0.0, need.tokens - state.tokens))
        chunk = self._chunk(state.limits) if ahead else Amount()
        want = Amount(missing.requests + chunk.requests, missing.tokens + chunk.tokens)
        limits, now = state.limits, self._wall()
        try:
            answer: Lease = await self.store.update(key, lambda s: lease(s, limits, now, missing, want))
        except QuotaStoreUnavailable:
            self._metrics.leases.labels("unavailable").inc()
            raise
        state.levels = answer.levels
        if answer.granted is None:
            self._metrics.leases.labels("refused").inc()
            state.blocked, state.blocked_until = answer, self._clock() + answer.retry_after
            return
        self._metrics.leases.labels("granted").inc()
        state.add(answer.granted)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            try:
                if self.in_fallback:
                    # A fallback entered on a slow answer ends when ZooKeeper answers again,
                    # even if the session never dropped (no state change would tell us).
                    await self.store.ping()
                    self._leave_fallback()
                else:
                    await self._return_idle()
            except QuotaStoreUnavailable as exc:
                self._enter_fallback(f"ZooKeeper did not answer ({exc})")

    async def _return_idle(self, *, all_keys: bool = False) -> None:
        """Give unspent balances of idle keys back to the shared bucket, for other gateways."""
        now = self._clock()
        for key, state in list(self._keys.items()):
            if not all_keys and now - state.last_used < self.idle_return_s:
                continue
            if state.refill is not None and not state.refill.done():
                continue
            spare = Amount(max(0.0, state.requests), max(0.0, state.tokens))
            if spare.requests or spare.tokens:
                state.add(spare, -1.0)  # before the write: if it fails the lease is lost, never doubled
                limits, wall = state.limits, self._wall()
                await self.store.update(key, lambda s: give_back(s, limits, wall, spare))
                self._metrics.leases.labels("returned").inc()
            # Forget the key only if nothing touched it during the write (a request may have).
            quiet = state.refill is None or state.refill.done()
            if quiet and state.requests == 0 and state.tokens == 0 and state.blocked_until <= self._clock():
                del self._keys[key]

    # -- fallback ----------------------------------------------------------------------------

    def _set_gateways(self, count: int) -> None:
        self._gateways = count
        self._metrics.gateways.set(count)

    def _set_connected(self, connected: bool) -> None:
        if connected:
            self._leave_fallback()
        else:
            self._enter_fallback("the ZooKeeper session is suspended")

    def _enter_fallback(self, why: str) -> None:
        if self._local is not None or self._closing:
            return
        n = self._gateways
        self._local = KeyLimiter(_shares(self._config, n), self._clock)
        for key, state in self._keys.items():
            start = {}
            for name, limit_field in DIMENSIONS:
                share = (getattr(state.limits, limit_field) or 0.0) / n
                seen = share if state.levels is None else max(0.0, state.levels.get(name)) / n
                start[name] = min(share, seen + max(0.0, getattr(state, name)))
            self._local.start_at(key, start["requests"], start["tokens"])
            state.fallback_spent = Amount()
        self._metrics.fallback.set(1)
        logger.warning("fleet quota: ZooKeeper unreachable (%s); this gateway admits 1/%d of every key's limit "
                       "(its share among the %d gateways last seen) until ZooKeeper answers again", why, n, n)

    def _leave_fallback(self) -> None:
        if self._local is None:
            return
        self._local = None
        for key, state in self._keys.items():
            for name, limit_field in DIMENSIONS:
                # What was admitted while cut off, up to one share, becomes debt on the shared bucket.
                share = (getattr(state.limits, limit_field) or 0.0) / self._gateways
                setattr(state, name, -min(share, state.fallback_spent.get(name)))
            state.blocked_until, state.fallback_spent = 0.0, Amount()
            if state.requests < 0 or state.tokens < 0:
                self._refill(key, state, Amount(), ahead=False)  # charge the debt now, not at the next request
        self._metrics.fallback.set(0)
        logger.info("fleet quota: ZooKeeper answers again; keys are shared by the fleet again (%d gateways)",
                    self._gateways)


def fleet_quota_from_config(config: AdmissionConfig, metrics_registry=None) -> FleetQuota | None:
    """The FleetQuota `config.fleet_quota` asks for (not started), or None when it is unset."""
    if not config.fleet_quota:
        return None
    return FleetQuota(ZooKeeperQuotaStore(config.fleet_quota), lease_fraction=config.fleet_quota_lease_fraction,
                      lease_wait_s=config.fleet_quota_lease_wait_s, idle_return_s=config.fleet_quota_idle_return_s,
                      metrics_registry=metrics_registry)


def _shares(config: AdmissionConfig, gateways: int) -> AdmissionConfig:
    def share(limits: KeyLimits) -> KeyLimits:
        return KeyLimits(**{name: value / gateways for name, value in limits.model_dump().items() if value})
    return config.model_copy(update={"default": share(config.default),
                                     "keys": {k: share(v) for k, v in config.keys.items()}})


def _refusal(key: str, limits: KeyLimits, answer: Lease | None, wait: float) -> RateLimitedError:
    reason = answer.reason if answer is not None and answer.reason else "requests_per_min"
    limit = getattr(limits, reason) or 0.0
    what = "requests" if reason == "requests_per_min" else "tokens"
    return RateLimitedError(
        f"key {key_label(key)} is over its fleet-wide limit of {limit:g} {what} per minute (all gateways together)",
        retry_after=wait, reason=reason,
    )

