"""StreamContext: everything a RoutedStream needs from the router, handed down as one frozen bundle.

The Router builds one per router (not per request) and gives it to every stream it makes, so a
stream reads only this bundle's public parts and never the Router itself: stream.py does not
import router.py. `connect(address)` returns the client to send one attempt through; the Router
defaults it to its ClientPool's `get`, and tests and benchmarks pass a fake one instead.
`hooks` are the concerns that act around each attempt (attempt_hooks.py): cache routing, the
batch gate, adapter placement. The stream calls them and knows none of them by name; the pick
(pick.py) reads the batch gate, its waits and the adapter placement it ranks by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from vllm_fleet.protocol.types import Chunk, GenerateRequest
from vllm_fleet.router.adapters import AdapterPlacement
from vllm_fleet.router.attempt_hooks import AttemptHooks
from vllm_fleet.router.quota.admission import Admission
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.batch_wait import BatchWaits
from vllm_fleet.router.budget import RetryBudget
from vllm_fleet.router.config import RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.policies import Policy
from vllm_fleet.router.pool.membership import Pool


class ChunkSource(Protocol):
    """The part of a WorkerClient a stream uses: one request's chunks, errors from vllm_fleet.errors."""

    def generate(self, request: GenerateRequest, *, timeout: float | None = None) -> AsyncIterator[Chunk]: ...


Connect = Callable[[str], ChunkSource]


@dataclass(frozen=True, slots=True)
class StreamContext:
    policy: Policy             # ranks the workers for a request
    pool: Pool                 # worker states: snapshot, leases, verdicts, progress
    batch: BatchGate           # batch per worker: its attempts, their stepping aside, its latency controller
    batch_waits: BatchWaits    # batch requests waiting for slack, and why
    budget: RetryBudget        # every extra attempt spends from it
    admission: Admission       # key buckets and class queues, passed before the first attempt
    metrics: RouterMetrics
    config: RouterConfig
    connect: Connect           # address -> the client one attempt streams from
    adapters: AdapterPlacement | None = None  # LoRA requests: which workers hold the adapter (the pick's preference)
    hooks: tuple[AttemptHooks, ...] = ()      # around each attempt, in this order (attempt_hooks.py)
