"""Trying again after an attempt that did not finish the answer (RoutedStream, stream.py).

* A batch attempt that stepped aside for interactive work (router/classes/service_class.py) is neither a
  failure nor a retry: withdrawn before its first token, or paused after it, it waits for slack
  again and resumes after what the caller has (`stepped_aside`).
* A failed attempt tells the worker's breaker that the worker failed, unless the failure is
  overload (a capacity signal) or a passed deadline (the caller's) (`failure_verdict`). Another
  attempt follows (`check_retry`): a failover before anything reached the caller, a migration
  after. None follows once the deadline has passed, `max_attempts` are used or the retry budget
  is spent (the worker's error is raised; `retry_headroom`: how much of it a retry may use), nor after tokens of a grammar-constrained answer
  (MigrationUnsupportedError, fatal: another worker could not keep the answer valid).
* Each attempt goes out under its own request id (`attempt_id`).
"""

from __future__ import annotations

import logging

from vllm_fleet.errors import (
    DeadlineExceededError,
    MigrationUnsupportedError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
    WorkerUnavailableError,
)
from vllm_fleet.protocol.types import GenerateRequest
from vllm_fleet.router.context import StreamContext
from vllm_fleet.router.delivered import Delivered

logger = logging.getLogger(__name__)


def attempt_id(request_id: str, attempts: int, withdrawals: int) -> str:
    """The request id of attempt number `attempts` (from 1): the caller's for the first, then one
    per attempt and per withdrawal (a withdrawn attempt's abort may not have reached its worker yet)."""
    attempt = request_id if attempts <= 1 else f"{request_id}-a{attempts}"
    if withdrawals:
        attempt += f"-w{withdrawals}"
    return attempt


def stepped_aside(ctx: StreamContext, address: str, delivered: Delivered, request_id: str) -> bool:
    """Count and log a batch attempt on `address` that stepped aside: True if it paused (the
    caller has some of its answer), False if it was withdrawn."""
    if delivered.any:
        ctx.metrics.pauses.inc()
        logger.info("batch request paused on %s for interactive work after %d tokens; requeued",
                    address, delivered.tokens(), extra={"request_id": request_id})
        return True
    ctx.metrics.withdrawals.inc()
    logger.info("batch request withdrawn from %s for interactive work; requeued", address,
                extra={"request_id": request_id})
    return False


def failure_verdict(exc: WorkerError) -> bool | None:
    """What a failed attempt tells its worker's breaker (Pool.report): False, the worker failed;
    None, nothing (overload is a capacity signal and a passed deadline is the caller's)."""
    return None if isinstance(exc, (WorkerOverloadedError, DeadlineExceededError)) else False


def retry_headroom(ctx: StreamContext, exc: WorkerError, address: str) -> float:
    """The share of the retry budget this retry may draw on. A worker that is gone (unreachable,
    its engine dead or stalled: UNAVAILABLE, or a stall by its own word) left its work behind, so
    moving that work adds nothing to the pool: the whole budget, as migration off a dead worker
    needs. A worker that answered with an error is up and busy: its share shrinks as the pool
    saturates (Pool.retry_headroom), since retrying into full queues only lengthens them."""
    if isinstance(exc, (WorkerUnavailableError, WorkerTimeoutError)):
        return 1.0
    return ctx.pool.retry_headroom(address)


def check_retry(ctx: StreamContext, exc: WorkerError, address: str, *, attempts: int, delivered: Delivered,
                request: GenerateRequest) -> None:
    """Log failed attempt number `attempts` (on `address`) and decide whether another may follow;
    re-raise if not. The one that follows is a migration if `delivered.any`, else a failover."""
    rid = request.request_id
    ctx.metrics.worker_failures.labels(address, type(exc).__name__).inc()
    logger.warning("attempt %d on %s failed: %s", attempts, address, exc, extra={"request_id": rid})
    if not exc.recoverable:  # the type says (errors.py): e.g. the caller's own deadline passed
        raise exc
    if delivered.any and request.constrained:
        tokens = delivered.tokens()
        raise MigrationUnsupportedError(
            f"worker {address} failed after {tokens} tokens of a grammar-constrained answer; it cannot "
            f"continue on another worker; retry the request", worker=address) from exc
    if attempts >= ctx.config.max_attempts:
        raise exc
    if not ctx.budget.try_spend(retry_headroom(ctx, exc, address)):
        ctx.metrics.rejections.labels("retry_budget").inc()
        logger.warning("retry budget exhausted; not retrying", extra={"request_id": rid})
        raise exc
    if delivered.any:
        ctx.metrics.migrations.inc()
    else:
        ctx.metrics.failovers.inc()
    ctx.metrics.retries.labels(type(exc).__name__).inc()
