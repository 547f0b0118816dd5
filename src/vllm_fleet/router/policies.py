"""Routing policies: pure functions `(request features, pool snapshot) -> ranked addresses`.

Every policy ranks all eligible workers (serving, breaker not open, right model and pool),
best first; the router dispatches to the first one that accepts and fails over down the list.
A policy keeps no state: round robin and power of two choices take their rotation and their
random draw from `features.ticket`, so the same inputs always give the same ranking.

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
from typing import ClassVar

from vllm_fleet.errors import ConfigError
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView

# Points per worker on the hash ring: enough that keys spread evenly over a few workers.
RING_POINTS_PER_WORKER = 64


class Policy(abc.ABC):
    name: ClassVar[str]

    def rank(self, features: RequestFeatures, snapshot: PoolSnapshot) -> list[str]:
        """Eligible workers for `features`, best first."""
        workers = snapshot.eligible(features.model, features.pool)
        if not workers and features.pool_fallback:  # the class's pool is empty or down: any pool (configured)
            workers = snapshot.eligible(features.model)
        if not workers:
            return []
        return [w.address for w in self.order(features, workers)]

    @abc.abstractmethod
    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
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

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
        # Rotating first spreads ties (an idle pool) instead of piling them on one address.
        return sorted(_rotated(workers, features.ticket), key=load_score)


class PowerOfTwo(Policy):
    name = "power_of_two"

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
        if len(workers) == 1:
            return list(workers)
        draw = random.Random(features.ticket).sample(range(len(workers)), 2)
        pair = sorted((workers[i] for i in draw), key=load_score)
        rest = sorted((w for i, w in enumerate(workers) if i not in draw), key=load_score)
        return pair + rest


class RoundRobin(Policy):
    name = "round_robin"

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
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

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
        key = self.key(features)
        if not key:
            return LeastOutstanding().order(features, workers)
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
    """The weights of cache-aware routing (RouterConfig's cache_* fields say what each means)."""

    prefill_weight: float = 1.0
    load_weight: float = 0.25
    queued_tokens: int = 256
    load_bound: float | None = 1.25
    home_tokens: int = 512
    copy_weight: float = 1.0
    home_balance: float | None = 1.1
    home_by_reuse: bool = True


class CacheAware(Policy):
    """Lowest cost first, where a worker's cost for this request is

        prefill_weight * (prompt_tokens - cached_tokens[worker])  the prefill it would still do
      + load_weight * load(worker)                                what it has to get through first
      + copy_weight * (most cached anywhere - cached[worker])     what it would copy from another's cache

    and load(worker) = its outstanding tokens of this router's requests + `queued_tokens` for each
    sequence it reports running or waiting beyond those (other routers' work). A worker whose
    events are not fresh (`WorkerView.kv_events_fresh` False) counts as holding nothing: its
    cost is its load alone, since a stale index may promise blocks it freed long ago.

    Bounded load: a worker whose load is above `load_bound` times the mean load, counting this
    request's tokens in the total, goes after every worker within the bound, however much of the
    prompt it holds (least loaded first), so one hot prefix cannot pile onto one worker while the
    others idle; within the bound the cheapest worker wins. `load_bound=None` drops the guard.
    Ties keep the ticket's rotation (sorting is stable), as least_outstanding does.

    A home for what nobody holds: the worker met first on the hash ring from the prompt's frontier
    (the first block no worker holds) is the prompt's home, and every worker holding no more of
    the prompt than the home pays what the home is worth, the tokens the prompt would leave cached
    there, at most `home_tokens` (a short prompt's home is worth little against load). The ring
    only proposes: the home is the first worker in the frontier's ring order whose cache holds no
    more than `home_balance` (1.1) times the workers' mean fill (see `home`). A hash gives each
    worker a share of the prefixes that varies by chance: 24 tenants on two workers' rings split
    15/9 or worse in a third of draws (simulated), and a worker given more prefixes than it holds
    evicts them in turn while the other has room; SMG sends a prefix it has not seen to the worker
    with the smallest tree for this reason. Once every cache is full, the fills are equal and the
    ring decides alone, so routers that see the same events keep agreeing. Without a home, a
    prefix held nowhere went to whichever worker was least loaded at that instant, and the next
    miss of a sibling prefix to the other: on the H200 run of workload (a) (24 prefixes, each
    worker's cache holding about half) both workers ended up holding copies of the same prefixes
    and the engines cached 56% of the prompts, below prefix affinity's 70% (its ring gives each
    prefix one home). The frontier, not the first block, names the home, so prompts that share a
    long common start (one system text for every tenant) still spread by what follows it. A
    worker holding more of the prompt than the home pays nothing when what it holds beyond the
    home is more than the prompt's new part (what no worker holds): the prompt is then mostly
    its prefix, and follows it. When the new part is the larger, as for a tenant's first document
    after a system text every worker has seen one copy of, where that new part is cached is what
    counts: the home is charged no copy of the common start and the holder still pays for being
    away, or every new document would pile onto whichever worker served the first request (a
    CPU run of workload (b), 2026-12-05: all 48 requests on one of two engines, P90 TTFT 1.07x
    round robin's). A load difference above the home's worth still wins, so the home decides
    only between workers otherwise about equal. The home is worth its tokens only as far as
    new prompts come back: `features.prefix_reuse` (router/cache/prefix_reuse.py: of the new parts of
    the model's recent mostly-new prompts, the share later prompts reused) scales it (`home_by_reuse` False:
    it does not), so where nothing comes back (workload c) a miss goes to the least loaded instead
    of waiting behind up to `home_tokens` of load for a reuse that never comes (2 CPU engines,
    2026-12-05/06: P90 TTFT 1.31x least outstanding's on average with the full home, 1.06x scaled
    over seven 32-request runs and 1.00-1.03x over two of 64; single short runs still vary up to
    1.36x).

    A copy costs twice: the tokens a worker would prefill again that another worker already
    holds cost their prefill now, and later the cache room they take (another prefix evicted,
    the running requests' KV squeezed until vLLM preempts and recomputes). On the H200 run of
    workload (a) at 2,000 blocks per worker, without the copy term one miss prefilling on a
    prefix's holder (~2,200 tokens of load) outweighed the 2,048 tokens a hit saves, so hits
    went to the other worker and copied the prefix there: both held copies, the engines recomputed
    10-37% more tokens than were sent, and P90 TTFT was 9.5x prefix affinity's. With it, a hit
    leaves its holder only for a load difference worth two prefills of the shared part.
    Prompts nobody holds (workload c) pay no copy, so it does not touch pure load balancing.

    Load counts a quarter of prefill by default (`load_weight` 0.25), not the same: a queued
    token delays the request once, a prefix prefilled again where it is not held costs its
    prefill now and evicts another prefix. At 1.0, when both H200 workers queued (workload a at
    64/s), a holder a few requests behind lost its hits to the other worker: P90 TTFT 2.16x
    prefix affinity's, tok/s 0.80x; at 0.25 in the same setup 0.79x and 1.06x. Below saturation
    (24/s) 0.25 kept P90 at 0.95x prefix affinity's (1.0: 0.83x), and with nothing shared
    (workload c) at 1.00x least outstanding's (1.0: 1.03x); on 2 saturated CPU engines 0.65x the
    P90 of 1.0. A weight switched to 0.25 only while every worker queued routed as 1.0 did."""

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

    def order(self, features: RequestFeatures, workers: Sequence[WorkerView]) -> list[WorkerView]:
        costs = self.costs
        loads = {w.address: self.load(w) for w in workers}

        def held(worker: WorkerView) -> int:
            return features.cached_tokens.get(worker.address, 0) if worker.kv_events_fresh else 0

        home = self.home(features.frontier_key, workers) if features.frontier_key and costs.home_tokens else None
        # What the home is worth: what this prompt leaves cached there, up to home_tokens, as far as
        # new prompts came back lately (little when none do: then the pull is pure delay).
        reuse = features.prefix_reuse if costs.home_by_reuse else 1.0
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
