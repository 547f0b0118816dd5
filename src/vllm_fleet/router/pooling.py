"""Routing one pooling request (embeddings, pooling, score, rerank, classify) to a worker.

A pooling request is answered whole and changes nothing, so it is idempotent: a worker that
fails it (dies, drains, times out) is followed by another, within the retry budget and
`max_attempts`, as a generation request fails over before its first token. Admission is the
same as generation's (key buckets, the short class's slots), charging the prompt's tokens.

Only workers whose model serves the endpoint (WorkerInfo.pooling_endpoints) are candidates,
ranked least-loaded first (`rank_pooling`, a pure function): a pooling request has no prefix or
session to follow. Concurrent requests go out concurrently; the engine batches them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from vllm_fleet.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    NoWorkerError,
    RateLimitedError,
    WorkerError,
)
from vllm_fleet.protocol.pooling import PoolRequest, PoolResult
from vllm_fleet.router.features import SHORT
from vllm_fleet.router.context import StreamContext
from vllm_fleet.router.retry import failure_verdict
from vllm_fleet.router.pool.snapshot import WorkerView

logger = logging.getLogger(__name__)

# Bytes of request body per token, for the admission estimate before the worker counts them.
BODY_BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class PoolAnswer:
    result: PoolResult
    worker: str       # the worker that answered
    attempts: int     # workers tried, this one included


def rank_pooling(views: list[WorkerView], serving: set[str], ticket: int) -> list[str]:
    """Addresses of `views` in `serving`, least loaded first (this router's in-flight requests,
    then the worker's own running + waiting); `ticket` rotates ties so equal workers share."""
    candidates = [v for v in views if v.address in serving]
    if not candidates:
        return []
    shift = ticket % len(candidates)
    rotated = candidates[shift:] + candidates[:shift]
    order = {v.address: i for i, v in enumerate(rotated)}
    rotated.sort(key=lambda v: (v.in_flight, v.queued, order[v.address]))
    return [v.address for v in rotated]


async def route_pool(ctx: StreamContext, request: PoolRequest, *, model: str, serving: set[str], key: str | None,
                     deadline: float | None, ticket: int) -> PoolAnswer:
    """Admit `request`, send it to the best worker of `serving` (addresses whose model is `model`
    and serves the endpoint), and fail over while a worker fails it. Raises RateLimitedError,
    NoWorkerError, InvalidRequestError (never retried), or the last worker's error."""
    loop = asyncio.get_running_loop()
    estimate = max(1, len(request.body_json) // BODY_BYTES_PER_TOKEN)
    try:
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        ticket_ = await ctx.admission.admit(key=key, workload_class=SHORT, tokens=estimate, timeout=timeout)
    except RateLimitedError as exc:
        ctx.metrics.rejections.labels(exc.reason).inc()
        ctx.metrics.requests.labels(model, "rejected").inc()
        raise
    used, outcome, attempts = 0, "error", 0
    tried: set[str] = set()
    ctx.budget.record_request()
    try:
        while True:
            address, lease = _pick(ctx, model, serving, tried, ticket, estimate)
            attempts += 1
            tried.add(address)
            verdict: bool | None = None
            try:
                timeout = None if deadline is None else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    raise DeadlineExceededError(f"the request's deadline passed before worker {address} answered",
                                                worker=address)
                result = await ctx.connect(address).pool(request, timeout=timeout)
                verdict, used, outcome = True, result.prompt_tokens, "ok"
                return PoolAnswer(result, address, attempts)
            except InvalidRequestError:
                verdict = True  # the worker did its job: it refused a bad request
                raise
            except WorkerError as exc:
                verdict = failure_verdict(exc)
                _before_retry(ctx, exc, address, attempts, request.request_id)
            finally:
                lease.release()
                ctx.pool.report(address, verdict)
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        ticket_.finish(used)
        ctx.metrics.requests.labels(model, outcome).inc()


def _pick(ctx: StreamContext, model: str, serving: set[str], tried: set[str], ticket: int, tokens: int):
    """The best-ranked worker not tried yet (tried ones last) whose breaker lets this through."""
    ranked = rank_pooling(ctx.pool.snapshot().eligible(model), serving, ticket)
    for address in [a for a in ranked if a not in tried] + [a for a in ranked if a in tried]:
        lease = ctx.pool.try_acquire(address, tokens)
        if lease is not None:
            return address, lease
    ctx.metrics.rejections.labels("no_worker").inc()
    raise NoWorkerError(f"no serving worker for model {model!r} can take the request now",
                        retry_after=ctx.pool.retry_after())


def _before_retry(ctx: StreamContext, exc: WorkerError, address: str, attempts: int, request_id: str) -> None:
    """Log a failed attempt; re-raise when no further attempt may follow."""
    ctx.metrics.worker_failures.labels(address, type(exc).__name__).inc()
    logger.warning("pooling attempt %d on %s failed: %s", attempts, address, exc, extra={"request_id": request_id})
    if not exc.recoverable or attempts >= ctx.config.max_attempts:  # the type says (errors.py)
        raise exc
    if not ctx.budget.try_spend():
        ctx.metrics.rejections.labels("retry_budget").inc()
        raise exc
    ctx.metrics.failovers.inc()
    ctx.metrics.retries.labels(type(exc).__name__).inc()
