"""One short call to one worker of a model, with failover: for answers any worker of the model
gives alike (vLLM's /tokenize, /detokenize, the render routes).

Workers are tried least busy first (this router's open requests on each); a worker that is
down or times out (a recoverable WorkerError) hands the call to the next. A refusal of the
request itself (InvalidRequestError) or a worker that cannot answer this kind of call is final:
every worker of the model would say the same.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from vllm_fleet.errors import NoWorkerError, WorkerError
from vllm_fleet.router.pool.snapshot import PoolSnapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def call_any_worker(snapshot: PoolSnapshot, connect: Callable[[str], Any], model: str | None,
                          call: Callable[[Any], Awaitable[T]]) -> T:
    """`call(client)` on a routable worker of `model` (any model if None), failing over on a
    recoverable worker error; NoWorkerError when none is left to try."""
    workers = sorted(snapshot.eligible(model), key=lambda w: (w.in_flight, w.outstanding_tokens, w.address))
    if not workers:
        raise NoWorkerError(f"no serving worker of {model or 'any model'} can answer now")
    last: WorkerError | None = None
    for worker in workers:
        try:
            return await call(connect(worker.address))
        except WorkerError as exc:
            if not exc.recoverable:
                raise
            logger.warning("worker %s failed a short call (%s); trying the next worker", worker.address, exc)
            last = exc
    raise NoWorkerError(f"every worker of {model or 'any model'} failed: {last}")
