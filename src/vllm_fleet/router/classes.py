"""Service classes: interactive traffic first, batch in what it leaves idle.

Every request is of one class. Interactive is the gateway's default; batch is Spark's and the
Batch API's, and any request may ask for it (the gateway: `service_tier: "flex"`, or a key whose
class is batch). The classes differ in three places:

* **Admission to a worker.** A batch request goes only to a worker with slack: nothing waiting
  in its engine, KV-cache usage under `batch_max_kv_usage`, and its running + waiting count
  (the worker's own Load, all routers' work) — or this router's requests on it, when those are
  more, since a Load is a little old — under `(1 - interactive_reserve) × max_num_seqs`. The
  reserve is kept for interactive work. With no such worker, batch waits (it is never failed for
  it) and is woken by every fresh Load and every finished attempt.
* **Withdrawal.** When an interactive request goes to a worker that has no room (requests
  waiting in its engine, or full), this router withdraws a batch request on that worker that
  has not produced its first token yet: its attempt is cancelled (the engine request aborted)
  and it waits for slack again. Nothing is lost and nothing was delivered, so the caller sees
  only a later first token. It costs no retry budget and no breaker verdict.
* **In the engine.** On a worker that schedules by priority (vLLM's `--scheduling-policy
  priority`, the worker's default), a batch request runs with `batch_priority` added to its
  vLLM priority (lower runs first), so under KV pressure vLLM preempts batch first. A request's
  own `priority` keeps vLLM's meaning within its class.

Starvation guard: batch always may hold `batch_min_share` of the serving workers' slots (at
least one request), slack or not, so a fleet that is never idle still finishes its batch jobs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable

from pydantic import Field

from vllm_fleet.config import FleetModel
from vllm_fleet.router.snapshot import WorkerView

INTERACTIVE, BATCH = "interactive", "batch"
SERVICE_CLASSES = (INTERACTIVE, BATCH)
# OpenAI's `service_tier` values and the class each runs as: "flex" is OpenAI's slower, cheaper tier.
SERVICE_TIERS = {"auto": INTERACTIVE, "default": INTERACTIVE, "priority": INTERACTIVE, "scale": INTERACTIVE, "flex": BATCH}
# A worker that reports no max_num_seqs (an old mock) is taken to have this many slots.
DEFAULT_SLOTS = 256


class ServiceClassConfig(FleetModel):
    """How batch shares the workers with interactive traffic (see router/classes.py)."""

    interactive_reserve: float = Field(
        0.25, ge=0, lt=1, description="Share of each worker's sequence slots (max_num_seqs) batch leaves free for "
        "interactive requests")
    batch_max_kv_usage: float = Field(
        0.85, gt=0, le=1, description="Batch goes to a worker only while its KV-cache usage is below this")
    batch_min_share: float = Field(
        0.05, ge=0, le=1, description="Starvation guard: batch may always hold this share of the serving workers' "
        "slots (at least one request), slack or not")
    batch_priority: int = Field(
        100, ge=0, description="Added to a batch request's vLLM priority on workers that schedule by priority "
        "(lower runs first), so KV pressure preempts batch first")
    withdraw_batch: bool = Field(
        True, description="Withdraw (cancel and requeue) a batch request that has no first token yet when an "
        "interactive request finds its worker without room")


def slots(view: WorkerView) -> int:
    return view.max_num_seqs or DEFAULT_SLOTS


def busy(view: WorkerView) -> int:
    """Sequences on the worker: its own count, or this router's requests there when more (fresher)."""
    return max(view.queued, view.in_flight)


def has_slack(view: WorkerView, config: ServiceClassConfig) -> bool:
    """Whether a batch request may start on this worker now."""
    load = view.load
    if load is None or load.waiting > 0 or load.kv_cache_usage >= config.batch_max_kv_usage:
        return False
    return busy(view) < math.floor(slots(view) * (1 - config.interactive_reserve))


def has_room(view: WorkerView) -> bool:
    """Whether an interactive request would start at once (nothing waits, a slot is free)."""
    load = view.load
    if load is not None and load.waiting > 0:
        return False
    return busy(view) < slots(view)


def guaranteed_batch(workers: Iterable[WorkerView], config: ServiceClassConfig) -> int:
    """Batch requests the starvation guard lets run whatever the slack."""
    total = sum(slots(w) for w in workers if w.routable)
    return max(1, math.floor(total * config.batch_min_share)) if total else 0


class BatchGate:
    """This router's batch bookkeeping: how many batch attempts run per worker, which of them
    have no first token yet (and can be withdrawn), and a wake-up for batch waiting for slack."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self._withdrawable: dict[str, dict[int, Callable[[], None]]] = {}
        self._changed = asyncio.Event()
        self.withdrawn = 0

    @property
    def total(self) -> int:
        return sum(self.running.values())

    def notify(self) -> None:
        """Capacity may have freed (a fresh Load, a finished attempt): batch waiting looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, timeout: float | None) -> None:
        """Until `notify()` (or `timeout` seconds)."""
        changed = self._changed
        try:
            await asyncio.wait_for(changed.wait(), timeout)
        except TimeoutError:
            pass

    def started(self, address: str, token: int, withdraw: Callable[[], None]) -> None:
        self.running[address] = self.running.get(address, 0) + 1
        self._withdrawable.setdefault(address, {})[token] = withdraw

    def first_token(self, address: str, token: int) -> None:
        self._withdrawable.get(address, {}).pop(token, None)

    def ended(self, address: str, token: int) -> None:
        self.first_token(address, token)
        left = self.running.get(address, 0) - 1
        if left > 0:
            self.running[address] = left
        else:
            self.running.pop(address, None)
        self.notify()

    def withdraw(self, address: str, count: int = 1) -> int:
        """Withdraw up to `count` batch attempts on `address` that have no first token; how many."""
        waiting = self._withdrawable.get(address)
        done = 0
        while waiting and done < count:
            _, withdraw = waiting.popitem()  # the newest: it has waited least
            withdraw()
            done += 1
        self.withdrawn += done
        return done
