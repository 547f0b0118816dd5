"""Why batch waits: the batch requests waiting for a worker with slack, and the reason per worker.

A batch request waits in the router until some worker has slack (classes/service_class.py; pick.py
`pick_batch`), and it is never failed for it. So a Spark job or a Batch API batch on a fleet
with no batch capacity simply stops moving; this module says why, in words a person can act
on: "no worker of model m has batch slack: w1 has 3 requests waiting in its engine; w2 KV-cache
usage 0.97 >= batch_max_kv_usage 0.9; ...".

Cheap on the request path: a request that starts waiting adds one entry to a dict (and the
gauge), and takes it out when it leaves the wait. The reason is built only when someone asks
(`Router.batch_wait_status()`, the log line below), from the pool's snapshot and the batch
gate, with the same checks, in the same order, as `has_slack`.

The log line (INFO): when waiting starts, then every `LOG_EVERY_S` while any request waits,
and once when none waits any more; at most one start line per `LOG_EVERY_S`, since on a busy
fleet batch requests wait for a moment all the time.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import (DEFAULT_SLOTS, ServiceClassConfig, batch_share, busy,
                                                     guaranteed_batch)
from vllm_fleet.router.pool.snapshot import HALF_OPEN, OPEN, SERVING, PoolSnapshot, WorkerView, serves

logger = logging.getLogger(__name__)

LOG_EVERY_S = 30.0
# Workers named in a reason; the rest are counted ("and 12 more workers").
NAMED_WORKERS = 4


@dataclass(frozen=True, slots=True)
class BatchWaitStatus:
    """Batch requests waiting for slack now: how many, since when, and why ("" when none waits)."""

    waiting: int = 0
    since: float | None = None   # wall clock (epoch seconds) when the longest-waiting one began
    waited_s: float = 0.0        # how long that one has waited
    reason: str = ""

    def to_dict(self) -> dict:
        return {"waiting": self.waiting, "since": self.since, "waited_s": round(self.waited_s, 1),
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class _Waiter:
    request_id: str
    model: str | None
    pool: str | None
    started: float    # the router's clock
    wall: float       # time.time(), for people


class BatchWaits:
    """The waiting batch requests of one router. `explain(model, pool)` says why a batch request
    of that model (and class pool) finds no worker with slack now; `gauge` is counted up and
    down (a prometheus Gauge: several routers sharing a registry add up)."""

    def __init__(self, explain: Callable[[str | None, str | None], str], gauge, clock: Callable[[], float]) -> None:
        self._explain = explain
        self._gauge = gauge
        self._clock = clock
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count()
        self._logged_at = float("-inf")
        self._logged_episode = False  # a line went out since waiting last started

    def start(self, request_id: str, model: str | None, pool: str | None) -> int:
        """A batch request starts waiting; the token to `end` it with."""
        first = not self._waiters
        token = next(self._ids)
        self._waiters[token] = _Waiter(request_id, model, pool, self._clock(), time.time())
        self._gauge.inc()
        if first:
            self._logged_episode = False
            self.tick()
        return token

    def end(self, token: int) -> None:
        """The request left the wait (it got a worker, its caller left, or it failed)."""
        waiter = self._waiters.pop(token, None)
        if waiter is None:
            return
        self._gauge.dec()
        if not self._waiters and self._logged_episode:
            self._logged_episode = False
            logger.info("batch requests no longer wait for slack (the last waited %.1f s)",
                        self._clock() - waiter.started, extra={"request_id": waiter.request_id})

    def tick(self) -> None:
        """Log the account if one is due (called as waiting requests wake: at least once a second)."""
        if not self._waiters or self._clock() - self._logged_at < LOG_EVERY_S:
            return
        status = self.status()
        self._logged_at = self._clock()
        self._logged_episode = True
        logger.info("%d batch request(s) waiting for slack, the longest for %.0f s: %s", status.waiting,
                    status.waited_s, status.reason)

    def status(self, *, model: str | None = None, request_ids: Collection[str] | None = None) -> BatchWaitStatus:
        """The waiting requests (of `model`; with ids in `request_ids`) and why they wait."""
        waiters = [w for w in self._waiters.values()
                   if (model is None or w.model == model) and (request_ids is None or w.request_id in request_ids)]
        if not waiters:
            return BatchWaitStatus()
        waiters.sort(key=lambda w: w.started)
        oldest = waiters[0]
        # One reason per (model, pool) that waits, the longest-waiting group's first.
        groups = list(dict.fromkeys((w.model, w.pool) for w in waiters))
        reason = "; ".join(self._explain(m, p) for m, p in groups)
        return BatchWaitStatus(len(waiters), oldest.wall, max(0.0, self._clock() - oldest.started), reason)


def why_no_slack(snapshot: PoolSnapshot, gate: BatchGate, model: str | None, pool: str | None) -> str:
    """Why a batch request of `model` (in class pool `pool`) finds no worker with slack: one
    clause per worker of the model, in `has_slack`'s order of checks."""
    config = gate.config
    workers = [w for w in snapshot if serves(w, model, pool)]
    of_model = f" of model {model!r}" if model else ""
    in_pool = f" in pool {pool!r}" if pool else ""
    if not workers:
        return f"no worker serves model {model!r}{in_pool}" if model else "no worker is known"
    clauses = [_why_not(w, gate, config) for w in workers]
    named = clauses[:NAMED_WORKERS]
    if len(clauses) > NAMED_WORKERS:
        named.append(f"and {len(clauses) - NAMED_WORKERS} more workers")
    text = f"no worker{of_model}{in_pool} has batch slack: " + "; ".join(named)
    guard = guaranteed_batch(workers, config)
    if guard and gate.total >= guard:
        text += (f" (the starvation guard's {guard} request(s), batch_min_share {config.batch_min_share}, "
                 f"are running)")
    return text


def _why_not(view: WorkerView, gate: BatchGate, config: ServiceClassConfig) -> str:
    """One worker's clause: what keeps batch off it now."""
    name = view.address
    if view.state != SERVING:
        return f"{name} is {view.state} (health {view.health})"
    if view.breaker == OPEN:
        return f"{name} circuit breaker open after failed requests"
    load = view.load
    if load is None:
        return f"{name} has not reported its load yet"
    if load.waiting > 0 and not gate.engine_schedules(name):
        return f"{name} has {load.waiting} request(s) waiting in its engine"
    if load.kv_cache_usage >= config.batch_max_kv_usage:
        return f"{name} KV-cache usage {load.kv_cache_usage:.2f} >= batch_max_kv_usage {config.batch_max_kv_usage}"
    share = batch_share(view, config)
    cap = gate.cap(name, share)
    if cap < share and view.batch_in_flight >= cap:
        ttft, itl = gate.targets(name)
        targets = ", ".join(f"{label} {value * 1000:.0f} ms" for label, value in (("TTFT", ttft), ("ITL", itl))
                            if value is not None)
        return (f"{name}: the latency controller cut batch to {cap:.0f} (of {share}) after interactive requests "
                f"missed their latency targets ({targets}); it lets batch back {config.batch_raise_every_s:g} s "
                f"after the misses stop")
    running = busy(view)
    if running >= share:
        slots = f"max_num_seqs {view.max_num_seqs}" if view.max_num_seqs else \
            f"max_num_seqs not reported, taken as {DEFAULT_SLOTS}"
        return (f"{name} running {running} >= batch cap {share} "
                f"(interactive_reserve {config.interactive_reserve} of {slots})")
    if view.breaker == HALF_OPEN:
        return f"{name} circuit breaker half-open: its one probe request is running"
    return f"{name} has slack now (a batch request is starting there)"
