"""Which worker a stream's next attempt goes to, and the lease that claims it.

RoutedStream (stream.py) asks once per attempt. The policy ranks the workers, a LoRA request
prefers those holding its adapter, and the best-ranked worker whose breaker lets the request
through is leased, the ones this stream tried already last. Two cases wait instead of failing:

* a request whose every routable worker refused only because a half-open breaker's one probe
  is in flight waits for that probe (`pick_or_await_probe`);
* a batch request waits for a worker with slack, on the pool's account of waiting batch
  (`pick_batch`; router/classes/service_class.py, classes/batch_wait.py).

When every worker that is up is out of rotation (open breakers, ejection), the request goes to
one of them anyway (panic mode, `PoolSnapshot.in_panic`): NoWorkerError means no worker is up.

The functions take what they read (the StreamContext, the request and its features, the workers
tried so far, what the cache index answered for the prompt when it was asked: `cache`, for the
policy) and `cost(address)`, the tokens the attempt will cost there; they keep no state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from vllm_fleet.errors import NoWorkerError
from vllm_fleet.protocol.types import GenerateRequest
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.classes.service_class import INTERACTIVE, batch_share, guaranteed_batch, has_slack
from vllm_fleet.router.context import StreamContext
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pool.snapshot import HALF_OPEN, PoolSnapshot
from vllm_fleet.router.pool.lease import Lease

logger = logging.getLogger(__name__)

# Batch waiting for slack looks again at least this often, even if no Load or finished attempt woke it.
BATCH_RECHECK_S = 1.0
# How often a request that found every worker's probe slot taken looks again.
PROBE_WAIT_POLL_S = 0.02


async def pick_or_await_probe(ctx: StreamContext, request: GenerateRequest, features: RequestFeatures,
                              tried: set[str], cost: Callable[[str], int], *,
                              cache: CacheMatch | None = None) -> tuple[str, Lease]:
    """`pick`, but when every routable worker refused only because a half-open breaker's
    one probe is in flight (a worker just back from a crash), wait for that probe's first
    output instead of failing: streams migrating off a dead worker all at once must not
    fail because the one survivor is still proving itself."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.config.first_chunk_timeout_s
    while True:
        try:
            return pick(ctx, request, features, tried, cost, cache=cache)
        except NoWorkerError:
            eligible = ctx.pool.snapshot().eligible(features.model, features.pool)
            if loop.time() >= deadline or not any(w.breaker == HALF_OPEN for w in eligible):
                raise
        await asyncio.sleep(PROBE_WAIT_POLL_S)


def pick(ctx: StreamContext, request: GenerateRequest, features: RequestFeatures, tried: set[str],
         cost: Callable[[str], int], *, cache: CacheMatch | None = None) -> tuple[str, Lease]:
    """The best-ranked worker not tried yet whose breaker lets this request through."""
    snapshot = ctx.pool.snapshot()
    ranked = ctx.policy.rank(features, snapshot, cache)
    if request.adapter and ctx.adapters is not None:
        ranked = ctx.adapters.prefer_holders(request.adapter, ranked, snapshot)
    for address in [a for a in ranked if a not in tried] + [a for a in ranked if a in tried]:
        lease = ctx.pool.try_acquire(address, cost(address))
        if lease is not None:
            if features.service_class == INTERACTIVE:
                view = snapshot.get(address)
                if view is not None:
                    ctx.batch.interactive_arrives(view)  # batch makes room if it must (classes/service_class.py)
            return address, lease
    panicked = snapshot.in_panic(features.model, features.pool)
    if panicked is not None:
        return _pick_in_panic(ctx, features, panicked, cost, cache)
    ctx.metrics.rejections.labels("no_worker").inc()
    model = f" for model {features.model!r}" if features.model else ""
    raise NoWorkerError(f"no serving worker{model} can take the request now", retry_after=ctx.pool.retry_after())


def _pick_in_panic(ctx: StreamContext, features: RequestFeatures, panicked: PoolSnapshot,
                   cost: Callable[[str], int], cache: CacheMatch | None) -> tuple[str, Lease]:
    """Every worker that is up is out of rotation (breaker or ejection): route among all of them,
    as Envoy's panic mode does, rather than refuse the request."""
    for address in ctx.policy.rank(features, panicked, cache):
        lease = ctx.pool.try_acquire(address, cost(address), panic=True)
        if lease is not None:
            ctx.metrics.panics.inc()
            logger.warning("panic: every worker of %r is out of rotation; routing to %s regardless",
                           features.model, address)
            return address, lease
    raise NoWorkerError(f"no serving worker for model {features.model!r} can take the request now",
                        retry_after=ctx.pool.retry_after())


async def pick_batch(ctx: StreamContext, request: GenerateRequest, features: RequestFeatures, tried: set[str],
                     cost: Callable[[str], int], waited: Callable[[float], None], *,
                     cache: CacheMatch | None = None) -> tuple[str, Lease]:
    """A worker with slack for a batch request, waiting for one as long as the deadline allows
    (router/classes/service_class.py); the starvation guard lets a few through regardless. While it waits it
    is on the pool's account of waiting batch (classes/batch_wait.py), which says why. `waited(seconds)`
    hears of each wait, which the stream adds to its deadline."""
    config = ctx.config.classes
    waits = ctx.batch_waits
    waiting: int | None = None
    try:
        while True:
            snapshot = ctx.pool.snapshot()
            ranked = ctx.policy.rank(features, snapshot, cache)
            if not ranked:  # no serving worker at all: NoWorkerError, as for interactive
                return pick(ctx, request, features, tried, cost, cache=cache)
            if request.adapter and ctx.adapters is not None:
                ranked = ctx.adapters.prefer_holders(request.adapter, ranked, snapshot)
            views = {a: snapshot.get(a) for a in ranked}
            gate = ctx.batch
            open_ = [a for a in ranked
                     if has_slack(views[a], config, gate.cap(a, batch_share(views[a], config)),
                                  engine_schedules=gate.engine_schedules(a))]
            if not open_ and ctx.batch.total < guaranteed_batch(views.values(), config):
                open_ = ranked  # starvation guard
            for address in [a for a in open_ if a not in tried] + [a for a in open_ if a in tried]:
                lease = ctx.pool.try_acquire(address, cost(address))
                if lease is not None:
                    return address, lease
            if waiting is None:
                waiting = waits.start(request.request_id, features.model, features.pool)
            else:
                waits.tick()
            # Time spent waiting for slack does not count against a batch request's deadline: the
            # deadline bounds its work, not its queue, so the wait never fails it.
            loop = asyncio.get_running_loop()
            waited_from = loop.time()
            await ctx.batch.wait(BATCH_RECHECK_S)
            waited(loop.time() - waited_from)
    finally:
        if waiting is not None:
            waits.end(waiting)
