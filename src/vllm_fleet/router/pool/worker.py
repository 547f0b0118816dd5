"""What the router tracks about one worker (WorkerState).

The pool (membership.py) keeps one WorkerState per registered worker and changes it as the
worker's Info, health and Loads come; policies never see it, only the frozen WorkerView it makes
for each snapshot, with the fields its listeners own (listener.py) filled in by them. An
attempt's claim on a worker is a Lease (lease.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import WorkerRecord
from vllm_fleet.router.pool.breaker import CircuitBreaker
from vllm_fleet.router.pool.snapshot import DOWN, DRAINING, EJECTED, SERVING, WorkerView


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

    @property
    def model(self) -> str:
        return self.info.model if self.info else self.record.model

    @property
    def pool(self) -> str:
        # The worker's own word (Info, from its --pool) wins; the registry record covers the time before Info.
        return self.info.pool if self.info and self.info.pool else self.record.pool

    def view(self, ejected: bool, fields: Mapping[str, object] = {}) -> WorkerView:
        """The frozen view of it now; `fields`: the ones its listeners own (batch, cache)."""
        info = self.info
        settings = info.settings if info else {}
        return WorkerView(
            address=self.address,
            model=self.model,
            pool=self.pool,
            state=self.state(ejected),
            breaker=self.breaker.state,
            health=self.health,
            load=self.load,
            in_flight=self.in_flight,
            outstanding_tokens=self.outstanding_tokens,
            max_model_len=info.max_model_len if info else 0,
            max_num_seqs=int(settings.get("max_num_seqs") or 0),
            schedules_by_priority=settings.get("scheduling_policy") == "priority",
            kv_blocks=int(settings.get("num_kv_blocks") or 0),
            **fields,
        )
