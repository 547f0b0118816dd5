"""What the router tracks about one worker (WorkerState), and one attempt's claim on it (Lease).

The pool (pool.py) keeps one WorkerState per registered worker and changes it as the worker's
Info, health and Loads come; policies never see it, only the frozen WorkerView it makes for each
snapshot. A stream's attempt holds a Lease from `Pool.try_acquire` while it runs: the lease counts
the attempt in flight with the tokens it still owes, and credits a half-open breaker's probe at
its first output.
"""

from __future__ import annotations

import asyncio

from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import WorkerRecord
from vllm_fleet.router.breaker import CircuitBreaker
from vllm_fleet.router.cache_routing import CacheRouting
from vllm_fleet.router.snapshot import DOWN, DRAINING, EJECTED, SERVING, WorkerView


class WorkerState:
    """Everything the router tracks about one worker (mutable; policies see WorkerView copies)."""

    def __init__(self, record: WorkerRecord, breaker: CircuitBreaker) -> None:
        self.record = record
        self.breaker = breaker
        self.info: WorkerInfo | None = None
        self.old_form_logged = False     # an older release's worker was refused (logged once)
        self.load: WorkerLoad | None = None
        self.load_at = 0.0              # when `load` came
        self.loads = 0                  # Loads taken so far
        self.health = "UNKNOWN"
        self.missed = 0                 # health checks in a row with no answer
        self.request_failed = False     # a request to it failed since its last health answer
        self.in_flight = 0
        self.outstanding_tokens = 0
        self.wake = asyncio.Event()     # set to have its health service asked now
        self.tasks: list[asyncio.Task] = []

    @property
    def address(self) -> str:
        return self.record.address

    def state(self, ejected: bool) -> str:
        if self.info is None or self.health != "SERVING":
            return DOWN
        if self.load is not None and self.load.draining:
            return DRAINING
        return EJECTED if ejected else SERVING

    def view(self, ejected: bool, batch_in_flight: int = 0, cache: CacheRouting | None = None) -> WorkerView:
        info = self.info
        settings = info.settings if info else {}
        return WorkerView(
            address=self.address,
            model=info.model if info else self.record.model,
            # The worker's own word (Info, from its --pool) wins; the registry record covers the time before Info.
            pool=info.pool if info and info.pool else self.record.pool,
            state=self.state(ejected),
            breaker=self.breaker.state,
            health=self.health,
            load=self.load,
            in_flight=self.in_flight,
            outstanding_tokens=self.outstanding_tokens,
            max_model_len=info.max_model_len if info else 0,
            max_num_seqs=int(settings.get("max_num_seqs") or 0),
            schedules_by_priority=settings.get("scheduling_policy") == "priority",
            batch_in_flight=batch_in_flight,
            kv_events_fresh=cache is not None and cache.fresh(self.address),
            cache_events=cache.events_state(self.address) if cache is not None else "",
            predicted_hit_rate=cache.predicted_hit_rate(self.address) if cache is not None else None,
            copied_share=cache.copied_share(self.address) if cache is not None else None,
            cache_blocks=cache.index.entries_of(self.address) if cache is not None else 0,
            kv_blocks=int(settings.get("num_kv_blocks") or 0),
        )


class Lease:
    """One attempt's claim on a worker: counts it in flight with its outstanding tokens."""

    __slots__ = ("_worker", "remaining", "probe", "credited")

    def __init__(self, worker: WorkerState, tokens: int, probe: bool = False) -> None:
        self._worker = worker
        self.remaining = tokens
        self.probe = probe          # holds a half-open breaker's one probe slot
        self.credited = False       # ... and its first output already counted as the probe's success
        worker.in_flight += 1
        worker.outstanding_tokens += tokens

    def progress(self, tokens: int) -> None:
        """A chunk came: `tokens` of the claim are done."""
        if self._worker is None:
            return
        if self.probe and not self.credited:
            # A probe proves the worker serves at its first output, not at its end: a stream
            # holding the one probe slot for its whole answer would keep a recovered worker to
            # one request at a time for minutes.
            self.credited = True
            self._worker.breaker.record_success()
        done = min(tokens, self.remaining)
        self.remaining -= done
        self._worker.outstanding_tokens -= done

    def release(self) -> None:
        if self._worker is None:
            return
        self._worker.in_flight -= 1
        self._worker.outstanding_tokens -= self.remaining
        self.remaining = 0
        self._worker = None
