"""PoolListener: how concerns outside the pool follow its workers without the pool knowing them.

The pool (membership.py) knows nothing of cache-aware routing or of the batch gate; the Router
registers each on it (`Pool.listen`), and the pool tells every listener, in the order they were
registered, what happened to a worker:

    joined(worker)      a worker entered the registry (its WorkerState is new)
    left(address)       it left; forget it (after its tasks stopped, before its metrics go)
    info(worker)        its Info came (`worker.info` is set): an awaitable returned here runs as
                        one of the worker's tasks, cancelled when it leaves (e.g. an event follower)
    loaded(worker)      a Load was taken (`worker.load` is set), before its health is applied
    view_fields(address)  the WorkerView fields this listener owns, for each snapshot

A listener reads the WorkerState it is handed and never changes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Protocol

from vllm_fleet.router.pool.worker import WorkerState


class PoolListener(Protocol):
    def joined(self, worker: WorkerState) -> None: ...

    def left(self, address: str) -> None: ...

    def info(self, worker: WorkerState) -> Awaitable[None] | None: ...

    def loaded(self, worker: WorkerState) -> None: ...

    def view_fields(self, address: str) -> Mapping[str, object]: ...
