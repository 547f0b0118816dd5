"""Service classes: interactive traffic first, batch in what it leaves idle.

This module holds the classes' settings and the rules on them (which worker has slack for
batch, the reserve, the starvation guard, when interactive work finds no room); the batch
gate that counts batch per worker, makes it step aside and runs the latency controller that
caps it is in classes/batch_gate.py.

Every request is of one class. Interactive is the gateway's default; batch is Spark's and the
Batch API's, and any request may ask for it (the gateway: `service_tier: "flex"`, or a key whose
class is batch). The classes differ in three places:

* **Admission to a worker.** A batch request goes only to a worker with slack: nothing waiting
  in its engine, KV-cache usage under `batch_max_kv_usage`, and its running + waiting count
  (the worker's own Load, all routers' work) — or this router's requests on it, when those are
  more, since a Load is a little old — under `(1 - interactive_reserve) × max_num_seqs`. The
  reserve is kept for interactive work. With no such worker, batch waits (it is never failed for
  it) and is woken by every fresh Load and every finished attempt.
* **Withdrawal and pause.** When an interactive request goes to a worker that has no room
  (requests waiting in its engine, or full), this router withdraws a batch request on that
  worker that has not produced its first token yet: its attempt is cancelled (the engine
  request aborted) and it waits for slack again. Nothing is lost and nothing was delivered, so
  the caller sees only a later first token. With none such, and only when the worker's slots
  are all taken (the interactive request would wait for a batch answer to end), it pauses a
  running one (`preempt_batch`): the attempt is cancelled the same way, and when slack returns
  it resumes after the tokens its caller already has, exactly as a migration does (stream.py),
  so the caller sees a gap in its stream, never a lost or repeated token. A pause is not free
  (the resumed request prefills its prompt and tokens again, less what the prefix cache still
  holds), so nothing pauses for a request the engine would schedule first anyway. A
  grammar-constrained batch request is never paused (it cannot resume, as it cannot migrate).
  Neither costs retry budget or a breaker verdict. The latency controller (classes/batch_gate.py) uses
  the same two steps to bring a worker's batch down to its cap at once, and only down to it.
* **Where the engine schedules by class** (a vLLM worker with the class scheduler and its step
  governor, the default, under `latency_control: auto`): none of the above guesses is made for
  it. Requests waiting in that engine do not hold batch back, nothing is withdrawn or paused
  for interactive work there, and the latency controller does not cut it: the engine admits
  interactive work first, preempts batch for it when its slots are full (keeping the batch
  request's place and tokens), and holds each step's batch to its slowdown target. The reserve,
  the KV-cache bound and the starvation guard stay.
* **In the engine.** On a worker that schedules by priority (vLLM's `--scheduling-policy
  priority`, the worker's default), a batch request runs with `batch_priority` added to its
  vLLM priority (lower runs first), so under KV pressure vLLM preempts batch first. A request's
  own `priority` keeps vLLM's meaning within its class.

Starvation guard: batch always may hold `batch_min_share` of the serving workers' slots (at
least one request), slack or not, so a fleet that is never idle still finishes its batch jobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from vllm_fleet.config import FleetModel
from vllm_fleet.router.pool.snapshot import WorkerView

INTERACTIVE, BATCH = "interactive", "batch"
SERVICE_CLASSES = (INTERACTIVE, BATCH)
# OpenAI's `service_tier` values and the class each runs as: "flex" is OpenAI's slower, cheaper tier.
SERVICE_TIERS = {"auto": INTERACTIVE, "default": INTERACTIVE, "priority": INTERACTIVE, "scale": INTERACTIVE, "flex": BATCH}
# A worker that reports no max_num_seqs (an old mock) is taken to have this many slots.
DEFAULT_SLOTS = 256


class ServiceClassConfig(FleetModel):
    """How batch shares the workers with interactive traffic (see router/classes/service_class.py and router/classes/batch_gate.py)."""

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
    preempt_batch: bool = Field(
        True, description="Also pause running batch requests (their tokens kept; each resumes where it stopped, "
        "as a migration does) when interactive work finds no free slot; grammar-constrained batch is never paused")
    pause_batch_on_cut: bool = Field(
        False, description="When interactive latency misses its targets, also pause the running batch requests over "
        "the worker's new batch cap (off: only those without a first token step aside, and the rest end as they "
        "would; each paused request prefills again when it resumes, which on compute-bound engines is more "
        "interference)")
    latency_control: Literal["auto", "router"] = Field(
        "auto", description="Who holds interactive latency against batch: auto: the engine where the worker's "
        "engine governs its own steps (its Info reports a batch_slowdown_target: vLLM workers with the class "
        "scheduler, by default), which also admits interactive work first and preempts batch for it, so there "
        "this router neither cuts batch nor withdraws or pauses it, nor holds it back while requests wait in the "
        "engine; elsewhere (stock or mock engines) this router's controller, withdrawal and pause; "
        "router: this router's rules everywhere, as before the engine could")
    interactive_targets: Literal["relative", "absolute"] = Field(
        "relative", description="relative: batch backs off a worker where interactive latency passes "
        "interactive_slowdown_target x what it is there without batch (the worker's own baseline, learnt while no "
        "batch ran there, else this router's, learnt while none of its batch did; until one is known, and for a "
        "target set to null, the _ms targets below apply); absolute: where it passes the _ms targets themselves")
    interactive_slowdown_target: float = Field(
        1.1, gt=1, description="With relative targets: how much slower (P90 against P90) interactive first "
        "tokens and token gaps on a worker may get with batch there than without before batch backs off")
    interactive_ttft_target_ms: float | None = Field(
        1000.0, gt=0, description="Batch backs off a worker where an interactive request waited longer than this "
        "for its first token (null: TTFT does not steer batch); with relative targets, only until the worker's "
        "latency without batch is known")
    interactive_itl_target_ms: float | None = Field(
        200.0, gt=0, description="Batch backs off a worker where over 10% of the last second's gaps between an "
        "interactive stream's tokens passed this (null: ITL does not steer batch); with relative targets, only "
        "until the worker's latency without batch is known")
    batch_raise_every_s: float = Field(
        1.0, gt=0, description="A latency miss halves a worker's batch cap (what batch holds there); each quiet "
        "window this long doubles it back up to half the level that missed, then adds one request per window")


def slots(view: WorkerView) -> int:
    return view.max_num_seqs or DEFAULT_SLOTS


def busy(view: WorkerView) -> int:
    """Sequences on the worker: its own count, or this router's requests there when more (fresher)."""
    return max(view.queued, view.in_flight)


def batch_share(view: WorkerView, config: ServiceClassConfig) -> int:
    """The most sequences a worker may run with batch among them: its slots less the reserve."""
    return math.floor(slots(view) * (1 - config.interactive_reserve))


def has_slack(view: WorkerView, config: ServiceClassConfig, cap: float | None = None, *,
              engine_schedules: bool = False) -> bool:
    """Whether a batch request may start on this worker now. `cap`: the latency controller's
    limit on this router's batch requests there (batch_gate.BatchGate.cap), None for no limit.
    `engine_schedules`: the worker's engine schedules by class (BatchGate.engine_schedules), so
    requests waiting in it do not hold batch back: its queue hands interactive work the next
    slot whatever batch waits beside it, and batch queued there is ready the step a slot frees."""
    load = view.load
    if load is None or (load.waiting > 0 and not engine_schedules) or load.kv_cache_usage >= config.batch_max_kv_usage:
        return False
    if cap is not None and view.batch_in_flight >= cap:
        return False
    return busy(view) < batch_share(view, config)


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
