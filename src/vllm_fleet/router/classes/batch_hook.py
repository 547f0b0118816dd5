"""BatchHook: the batch gate around a stream's attempts (router/attempt_hooks.py).

A batch attempt is on the gate (classes/batch_gate.py) from its pick to its end: withdrawable
until its first token, then pausable if it can resume elsewhere (not grammar-constrained), and
sent at a lower priority where the worker schedules by priority (KV pressure preempts batch
first). An interactive attempt, while the gate listens, reports its time to first token and
between tokens, which steers how much batch each worker runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.protocol.types import Chunk
from vllm_fleet.router.attempt_hooks import Attempt, AttemptHooks, HookedStream
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import BATCH, ServiceClassConfig, batch_share
from vllm_fleet.router.pool.snapshot import PoolSnapshot


@dataclass(slots=True)
class BatchHandle:
    stream: HookedStream
    batch: bool                  # a batch request (else interactive)
    steer: bool = False          # this interactive attempt reports its latency to the gate
    last_at: float = 0.0         # loop time of the attempt's start, then of its last chunk with tokens


class BatchHook(AttemptHooks):
    def __init__(self, gate: BatchGate, snapshot: Callable[[], PoolSnapshot], config: ServiceClassConfig) -> None:
        self.gate = gate
        self._snapshot = snapshot
        self._config = config

    async def prepare(self, stream: HookedStream) -> BatchHandle:
        return BatchHandle(stream, batch=stream.features.service_class == BATCH)

    def routed(self, handle: BatchHandle, attempt: Attempt) -> None:
        if not handle.batch:
            handle.steer = self.gate.listening  # interactive latency steers batch (classes/batch_gate.py)
            handle.last_at = asyncio.get_running_loop().time()
            return
        self.gate.started(attempt.address, id(handle.stream), handle.stream.step_aside)
        view = self._snapshot().get(attempt.address)
        if view is not None and view.schedules_by_priority:  # KV pressure preempts batch first
            attempt.request = dataclasses.replace(attempt.request,
                                                  priority=attempt.request.priority + self._config.batch_priority)

    def first_token(self, handle: BatchHandle, attempt: Attempt) -> None:
        if handle.batch:  # from here on it can only pause, and only if it can resume
            stream = handle.stream
            self.gate.first_token(attempt.address, id(stream),
                                  pause=None if stream.request.constrained else stream.step_aside)

    def chunk(self, handle: BatchHandle, attempt: Attempt, chunk: Chunk, first: bool) -> None:
        if not handle.steer or not chunk.token_ids:
            return
        now = asyncio.get_running_loop().time()
        gap = now - handle.last_at
        handle.last_at = now
        address = attempt.address
        self.gate.observe(address, ttft_s=gap if first else None,
                          itl_s=None if first else gap / len(chunk.token_ids),
                          share=lambda: self._share(address))

    def attempt_ended(self, handle: BatchHandle, attempt: Attempt, error: BaseException | None) -> None:
        if handle.batch:
            self.gate.ended(attempt.address, id(handle.stream))

    def _share(self, address: str) -> int:
        view = self._snapshot().get(address)
        return batch_share(view, self._config) if view is not None else 0
