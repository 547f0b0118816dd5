"""Routing policies: pure functions `(request features, pool snapshot, cache match) -> ranked addresses`.

Every policy ranks all eligible workers (serving, breaker not open, right model and pool),
best first; the router dispatches to the first one that accepts and fails over down the list.
A policy keeps no state: round robin and power of two choices take their rotation and their
random draw from `features.ticket`, so the same inputs always give the same ranking. The cache
match (router/cache/match.py: who holds the prompt's blocks, per the router's cache index) is
cache_aware's input alone; the others take it and ignore it.

    least_outstanding   fewest tokens still expected (prompt + output) of this router's requests
    power_of_two        two workers drawn at random, the less loaded first (cheap, herd-free)
    session_affinity    consistent hash of session_id with bounded load: a conversation stays
                        on the worker that holds its prefix cache unless that worker is overfull
    prefix_affinity     the same ring, keyed by the prompt's first characters (shared system prompts)
    round_robin         each worker in turn; the baseline for benchmarks
    cache_aware         lowest cost: the prefill a worker still has to do for this prompt (prompt
                        tokens less the leading tokens it holds, per the router's cache index)
                        plus its load, with a bounded-load guard (see CacheAware)
"""

from __future__ import annotations

import abc
import bisect
import functools
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from vllm_fleet.errors import ConfigError
from vllm_fleet.router.cache.match import NOTHING_HELD, CacheMatch
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView

if TYPE_CHECKING:
    from vllm_fleet.router.config import RouterConfig

# Points per worker on the hash ring: enough that keys spread evenly over a few workers.
RING_POINTS_PER_WORKER = 64


class Policy(abc.ABC):
    name: ClassVar[str]

    def rank(self, features: RequestFeatures, snapshot: PoolSnapshot, cache: CacheMatch | None = None) -> list[str]:
        """Eligible workers for `features`, best first. `cache`: what the router's cache index
        answered for the prompt (CacheRouting.match); None: nothing known, no worker holds any."""
        workers = snapshot.eligible(features.model, features.pool)
        if not workers and features.pool_fallback:  # the class's pool is empty or down: any pool (configured)
            workers = snapshot.eligible(features.model)
        if not workers:
            return []
        return [w.address for w in self.order(features, workers, NOTHING_HELD if cache is None else cache)]

    @abc.abstractmethod
    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        """Sort the (non-empty, address-sorted) eligible workers, best first."""


def load_score(worker: WorkerView) -> tuple[int, int, int]:
    """Lower is less loaded: this router's outstanding tokens, then all work the worker
    reports (other routers' too), then open requests."""
    return (worker.outstanding_tokens, worker.queued, worker.in_flight)


def _rotated(workers: Sequence[WorkerView], ticket: int) -> list[WorkerView]:
    start = ticket % len(workers)
    return [*workers[start:], *workers[:start]]


class LeastOutstanding(Policy):
    name = "least_outstanding"

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        # Rotating first spreads ties (an idle pool) instead of piling them on one address.
        return sorted(_rotated(workers, features.ticket), key=load_score)


class PowerOfTwo(Policy):
    name = "power_of_two"

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        if len(workers) == 1:
            return list(workers)
        draw = random.Random(features.ticket).sample(range(len(workers)), 2)
        pair = sorted((workers[i] for i in draw), key=load_score)
        rest = sorted((w for i, w in enumerate(workers) if i not in draw), key=load_score)
        return pair + rest


class RoundRobin(Policy):
    name = "round_robin"

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        return _rotated(workers, features.ticket)


def _hash(text: str) -> int:
    # A stable hash (not Python's salted hash()): every gateway and Spark executor must map
    # a session to the same worker.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=64)
def _ring(addresses: tuple[str, ...]) -> tuple[list[int], list[str]]:
    points = sorted((_hash(f"{address}#{i}"), address) for address in addresses for i in range(RING_POINTS_PER_WORKER))
    return [p for p, _ in points], [a for _, a in points]


def ring_first(key: str, addresses: Sequence[str]) -> str:
    """`ring_order(key, addresses)[0]` without walking on to the others (~4 us less for 8 workers)."""
    hashes, owners = _ring(tuple(sorted(addresses)))
    return owners[bisect.bisect(hashes, _hash(key)) % len(owners)]


def ring_order(key: str, addresses: Sequence[str]) -> list[str]:
    """Distinct addresses in the order met walking the ring clockwise from `key`'s point."""
    hashes, owners = _ring(tuple(sorted(addresses)))
    start = bisect.bisect(hashes, _hash(key))
    seen: dict[str, None] = {}
    for i in range(len(owners)):
        seen.setdefault(owners[(start + i) % len(owners)], None)
        if len(seen) == len(addresses):
            break
    return list(seen)


class SessionAffinity(Policy):
    """Consistent hashing with bounded loads: a worker is skipped while it has more than
    `load_bound` times the mean in-flight requests (counting this one), so a hot session
    cannot pile onto one worker, and most keys keep their worker when the pool changes.

    The in-flight counts are this router's own, so with a bound two routers (two gateways,
    two Spark executor processes) may send one key to different workers, and one router may
    move a key between requests as its load shifts. `load_bound=None` drops the bound: the
    worker then depends only on the key and on which workers serve, the same in every router;
    a key moves only when its worker stops serving (to the next worker on the ring)."""

    name = "session_affinity"

    def __init__(self, load_bound: float | None = 1.25) -> None:
        self.load_bound = load_bound

    def key(self, features: RequestFeatures) -> str:
        return features.session_key

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        key = self.key(features)
        if not key:
            return LeastOutstanding().order(features, workers, cache)
        by_address = {w.address: w for w in workers}
        walk = [by_address[a] for a in ring_order(key, list(by_address))]
        if self.load_bound is None:
            return walk
        total = sum(w.in_flight for w in workers) + 1
        bound = math.ceil(self.load_bound * total / len(workers))
        within = [w for w in walk if w.in_flight + 1 <= bound]
        over = sorted((w for w in walk if w.in_flight + 1 > bound), key=load_score)
        return within + over


class PrefixAffinity(SessionAffinity):
    name = "prefix_affinity"

    def key(self, features: RequestFeatures) -> str:
        return features.prefix_key


@dataclass(frozen=True, slots=True)
class CacheCosts:
    """The weights of cache-aware routing (RouterConfig's cache_load_weight and cache_home_tokens, and
    router/cache/tuning.py's CacheTuning, say what each means)."""

    prefill_weight: float = 1.0
    load_weight: float = 0.25
    queued_tokens: int = 256
    load_bound: float | None = 1.25
    home_tokens: int = 512
    copy_weight: float = 1.0
    home_balance: float | None = 1.1
    home_by_reuse: bool = True

    @classmethod
    def of(cls, config: RouterConfig) -> CacheCosts:
        """The weights a RouterConfig sets: its two cache knobs, the rest from its CacheTuning."""
        tuning = config.cache_tuning
        return cls(prefill_weight=tuning.prefill_weight, load_weight=config.cache_load_weight,
                   queued_tokens=tuning.queued_tokens, load_bound=tuning.load_bound,
                   home_tokens=config.cache_home_tokens, copy_weight=tuning.copy_weight,
                   home_balance=tuning.home_balance, home_by_reuse=tuning.home_by_reuse)


class CacheAware(Policy):
    """Lowest cost first, where a worker's cost for this request, in prompt tokens, is

        prefill_weight * (prompt_tokens - cached[worker])        the prefill it would still do
      + load_weight * load(worker)                               what it has to get through first
      + copy_weight * (most cached anywhere - cached[worker])    a copy of another worker's blocks
      + home_worth, on every worker but the prompt's home        where a prefix nobody holds goes

    load(worker) is its outstanding tokens of this router's requests plus `queued_tokens` per
    sequence it reports beyond them (other routers' work). Load weighs a quarter of prefill: a
    queued token delays one request once, a prefix prefilled again costs that prefill now and
    evicts another prefix later. The copy term exists because that eviction is a second cost: a
    hit leaves its holder only for a load difference worth two prefills of the shared part. The
    home (first worker on the hash ring of the prompt's frontier, the first block no worker holds,
    whose cache fill is within `home_balance` of the mean) makes routers that do not see each
    other's load put a new prefix in one place, so the caches split prefixes instead of copying
    them; it is worth what the prompt would leave cached there, at most `home_tokens`, scaled by
    how often new prompts came back (`cache.prefix_reuse`, unless `home_by_reuse` is off). What
    the prompt is mostly made of picks between the two: a worker holding more than the home pays no
    home while its lead outweighs the prompt's new part, and the home pays no copy while the new
    part is the larger (`order`). A worker whose events are not fresh counts as holding nothing. Above `load_bound` times the mean
    load a worker goes after every other, so a hot prefix cannot pile onto one. Ties keep the
    ticket's rotation. The runs that set each weight: benchmarks/RESULTS.md, "Cache-aware
    routing's internal constants"."""

    name = "cache_aware"

    def __init__(self, costs: CacheCosts | None = None) -> None:
        self.costs = costs or CacheCosts()

    def home(self, frontier_key: str, workers: Sequence[WorkerView]) -> WorkerView:
        """The first worker on the frontier's ring order whose cache fill is within `home_balance`
        times the mean fill (the ring alone while any worker's events are not fresh: its blocks are
        not known). Fill is the blocks the index holds there, as a share of the worker's cache when
        every worker says its size (a MIG slice holds fewer prefixes than a whole GPU)."""
        by_address = {w.address: w for w in workers}
        first = by_address[ring_first(frontier_key, list(by_address))]
        balance = self.costs.home_balance
        if balance is None or len(workers) < 2 or not all(w.kv_events_fresh for w in workers):
            return first
        sized = all(w.kv_blocks > 0 for w in workers)
        fill = {w.address: w.cache_blocks / w.kv_blocks if sized else float(w.cache_blocks) for w in workers}
        limit = balance * sum(fill.values()) / len(fill)
        if fill[first.address] <= limit:
            return first
        # The least filled is at most the mean, so some worker is always within the limit.
        return next(by_address[a] for a in ring_order(frontier_key, list(by_address)) if fill[a] <= limit)

    def load(self, worker: WorkerView) -> int:
        others = max(0, worker.queued - worker.in_flight)
        return worker.outstanding_tokens + self.costs.queued_tokens * others

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView], cache: CacheMatch) -> list[WorkerView]:
        costs = self.costs
        loads = {w.address: self.load(w) for w in workers}

        def held(worker: WorkerView) -> int:
            return cache.held(worker.address) if worker.kv_events_fresh else 0

        home = self.home(cache.frontier_key, workers) if cache.frontier_key and costs.home_tokens else None
        # What the home is worth: what this prompt leaves cached there, up to home_tokens, as far as
        # new prompts came back lately (little when none do: then the pull is pure delay).
        reuse = cache.prefix_reuse if costs.home_by_reuse else 1.0
        home_worth = 0.0 if home is None else reuse * min(
            costs.home_tokens, max(0, features.prompt_tokens - held(home)))
        most_held = max((held(w) for w in workers), default=0)
        new_part = max(0, features.prompt_tokens - most_held)  # cached afresh wherever the prompt goes

        def cost(worker: WorkerView) -> float:
            cached = held(worker)
            prefill = max(0, features.prompt_tokens - cached)
            away = copied = 0.0
            if home is not None and worker is not home:
                # A worker holding more than the home pays for being away only while the prompt's
                # new part outweighs that lead (then the new part's placement decides).
                away = home_worth if cached <= held(home) or new_part >= cached - held(home) else 0
            if home is None or worker is not home or new_part < most_held - cached:
                copied = costs.copy_weight * (most_held - cached)
            return costs.prefill_weight * prefill + costs.load_weight * loads[worker.address] + away + copied

        rotated = _rotated(workers, features.ticket)
        if costs.load_bound is None:
            return sorted(rotated, key=cost)
        bound = costs.load_bound * (sum(loads.values()) + features.cost_tokens) / len(workers)
        within = sorted((w for w in rotated if loads[w.address] <= bound), key=cost)
        over = sorted((w for w in rotated if loads[w.address] > bound), key=lambda w: loads[w.address])
        return within + over


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (LeastOutstanding, PowerOfTwo, SessionAffinity, PrefixAffinity, RoundRobin, CacheAware)
}


def make_policy(name: str, *, load_bound: float | None = 1.25, cache_costs: CacheCosts | None = None) -> Policy:
    cls = POLICIES.get(name)
    if cls is None:
        raise ConfigError(f"unknown routing policy {name!r}; choose one of: {', '.join(POLICIES)}")
    if issubclass(cls, SessionAffinity):
        return cls(load_bound)
    if cls is CacheAware:
        return CacheAware(cache_costs)
    return cls()
