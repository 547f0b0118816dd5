"""The Router: pool state + policy + breakers + retry budget + admission, behind one object.

The request path: `Router.stream(request)` checks the model and estimates the request
(features.py), then returns a RoutedStream (stream.py) holding the router's StreamContext
(context.py), one frozen bundle of the parts a stream uses. The stream admits, ranks, leases a
worker, streams through `connect(address)` and reports its verdict to the pool; it never sees
the Router, and stream.py does not import this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Collection

from prometheus_client import CollectorRegistry

from vllm_fleet.client import ClientPool
from vllm_fleet.errors import InvalidRequestError, NoWorkerError, UnknownModelError
from vllm_fleet.protocol.types import GenerateRequest, WorkerInfo
from vllm_fleet.registry import Registry
from vllm_fleet.router.adapters import AdapterHook, AdapterPlacement
from vllm_fleet.router.quota.admission import Admission
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.batch_hook import BatchHook
from vllm_fleet.router.classes.batch_wait import BatchWaits, BatchWaitStatus, why_no_slack
from vllm_fleet.router.budget import RetryBudget
from vllm_fleet.router.config import KeyLimits, RouterConfig
from vllm_fleet.router.context import Connect, StreamContext
from vllm_fleet.router.cache.hook import CacheHook
from vllm_fleet.router.cache.routing import CacheRouting
from vllm_fleet.router.classes.service_class import SERVICE_CLASSES
from vllm_fleet.router.prompt.tokenizers import TokenizerCache
from vllm_fleet.router.features import features_of
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.policies import CacheCosts, make_policy
from vllm_fleet.router.pool.membership import Pool
from vllm_fleet.router.quota.fleet import FleetQuota
from vllm_fleet.router.quota.shared_buckets import SharedBucketFile
from vllm_fleet.protocol.pooling import ENDPOINT_PATHS, PoolRequest
from vllm_fleet.router.pooling import PoolAnswer, route_pool
from vllm_fleet.router.pool.snapshot import SERVING, PoolSnapshot
from vllm_fleet.router.stream import RoutedStream
from vllm_fleet.router.unary import call_any_worker

logger = logging.getLogger(__name__)


class Router:
    """Routes GenerateRequests over the workers of `registry`. Use inside one event loop.

    `pool` is the ClientPool to reach workers through (one is created, and closed with the
    router, if None). The router starts and closes the registry unless `own_registry=False`.
    Metrics go to `metrics_registry` (default: prometheus_client's global registry).
    `connect(address)` gives the client each stream attempt goes through (default: the
    ClientPool's `get`); health, Info and Load polling always use the ClientPool.
    `quota` (started and closed by the caller) makes key budgets fleet-wide (router/quota/fleet.py).
    """

    def __init__(self, registry: Registry, config: RouterConfig | None = None, pool: ClientPool | None = None, *,
                 own_registry: bool = True, metrics_registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic, connect: Connect | None = None,
                 quota: FleetQuota | None = None, shared_key_buckets: SharedBucketFile | None = None) -> None:
        self.registry = registry
        self.config = config or RouterConfig()
        self.clients = pool or ClientPool()
        self._owns_clients = pool is None
        self._owns_registry = own_registry
        self._metrics = RouterMetrics.for_registry(metrics_registry)
        self._policy = make_policy(self.config.policy, load_bound=self.config.affinity_load_bound,
                                   cache_costs=CacheCosts.of(self.config))
        self._budget = RetryBudget(ratio=self.config.retry_budget_ratio, min_per_s=self.config.retry_budget_min_per_s,
                                   window_s=self.config.retry_budget_window_s, clock=clock)
        self._admission = Admission(self.config.admission, clock=clock, quota=quota, shared_keys=shared_key_buckets)
        tokenizers = None
        self._tokenizer_dir: str | None = None
        if self.config.policy == "cache_aware":  # prompts are tokenized as the workers do, for the index
            self._tokenizer_dir = tempfile.mkdtemp(prefix="vllm-fleet-tokenizers-")
            tokenizers = TokenizerCache(self._tokenizer_dir)
        # cache_aware keeps an index of every worker's KV-cache blocks, from their event streams.
        self._cache = (CacheRouting(self.config, self.clients.get, self._metrics, tokenizers=tokenizers, clock=clock)
                       if self.config.policy == "cache_aware" else None)
        self._pool = Pool(registry, self.clients, self.config, self._metrics, clock=clock)
        # batch per worker and its latency controller; batch requests waiting for slack, and why
        self._batch = BatchGate(self.config.classes, clock, on_cut=self._metrics.count_cut,
                                view_of=lambda address: self._pool.snapshot().get(address))
        self._batch_waits = BatchWaits(
            lambda model, pool: why_no_slack(self._pool.snapshot(), self._batch, model, pool),
            self._metrics.batch_waiting, clock)
        self._pool.listen(self._batch)
        if self._cache is not None:
            self._pool.listen(self._cache)  # follows each worker's KV-cache events
        self.adapters = AdapterPlacement(self._pool.snapshot, self.clients.get,
                                         overlay_s=max(1.0, 3 * self.config.load_poll_interval_s), clock=clock)
        self._tickets = itertools.count()
        # Around each attempt, in this order: cache holds and ids, the batch gate, adapter placement.
        hooks = (CacheHook(self._cache, self._metrics, self._pool.serving),) if self._cache is not None else ()
        hooks += (BatchHook(self._batch, self._pool.snapshot, self.config.classes), AdapterHook(self.adapters))
        self._context = StreamContext(
            policy=self._policy, pool=self._pool, budget=self._budget, admission=self._admission,
            metrics=self._metrics, config=self.config, connect=connect or self.clients.get, adapters=self.adapters,
            batch=self._batch, batch_waits=self._batch_waits, hooks=hooks,
        )
        for name, queue in self._admission.queues.items():
            self._metrics.watch_queue(name, lambda q=queue: q.depth)

    @property
    def policy(self) -> str:
        return self._policy.name

    async def start(self) -> None:
        """Start the registry, then track each worker: Info on join, health and Load polling."""
        if self._owns_registry:
            await self.registry.start()
        await self._pool.start()
        logger.info("router started: policy %s, %d worker(s) registered", self.policy, len(self.registry.members()))

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until at least one worker is SERVING; NoWorkerError after `timeout` seconds."""
        await self._pool.wait_ready(timeout)

    def cache_stats(self) -> dict:
        """cache_aware: the index's counters and sizes (empty for other policies)."""
        return self._cache.stats() if self._cache is not None else {}

    async def wait_cache_ready(self, timeout: float = 60.0) -> None:
        """cache_aware: until every serving worker's KV events are followed in order and each
        model's tokenizer is loaded here (benchmarks and tests; routing itself never waits).
        NoWorkerError after `timeout` seconds."""
        if self._cache is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._cache.ready(self._pool.snapshot()):
            if loop.time() >= deadline:
                raise NoWorkerError(f"cache-aware routing not ready within {timeout:.0f}s: "
                                    f"{self._cache.describe(self._pool.snapshot())}")
            await self._pool.changed(min(0.1, deadline - loop.time()))

    async def close(self) -> None:
        await self._pool.close()
        if self._cache is not None:
            self._cache.close()
        if self._owns_registry:
            await self.registry.close()
        if self._owns_clients:
            await self.clients.close()
        if self._tokenizer_dir is not None:
            shutil.rmtree(self._tokenizer_dir, ignore_errors=True)

    async def __aenter__(self) -> Router:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- views --------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        return self._pool.snapshot()

    def models(self) -> list[str]:
        """Models served by at least one serving worker."""
        return self._pool.snapshot().models()

    def model_info(self, model: str) -> WorkerInfo | None:
        """Info of a serving worker of `model` (any worker of it if none serves), else None."""
        found = None
        for view in self._pool.snapshot():
            worker = self._pool.worker(view.address)
            if worker is None or worker.info is None or worker.info.model != model:
                continue
            if view.state == SERVING:
                return worker.info
            found = found or worker.info
        if found is None and (base := self.adapters.base_of(model)) is not None:
            return self.model_info(base)  # an adapter: its base model's context length
        return found

    async def introspect(self, endpoint: str, body: dict, *, model: str | None = None) -> object:
        """vLLM's answer at one of its token/render endpoints from a worker of `model` (an
        adapter's name resolves to its base model), with failover (unary.py)."""
        base = self._resolve_adapter_model(model)
        return await call_any_worker(self._pool.snapshot(), self.clients.get, base,
                                     lambda client: client.introspect(endpoint, body))

    def _resolve_adapter_model(self, model: str | None) -> str | None:
        try:
            return self._resolve_model(model)
        except UnknownModelError:
            base = self.adapters.base_of(model or "")
            if base is None:
                raise
            return base

    def queue_depths(self) -> dict[str, int]:
        """Requests waiting for a slot now, per workload class."""
        return {name: queue.depth for name, queue in self._admission.queues.items()}

    def batch_wait_status(self, *, model: str | None = None,
                          request_ids: Collection[str] | None = None) -> BatchWaitStatus:
        """Batch requests waiting for a worker with slack now (of `model`; with ids in
        `request_ids`): how many, since when, and why, per worker (router/classes/batch_wait.py). Cheap:
        the reason is built on this call."""
        return self._batch_waits.status(model=model, request_ids=request_ids)

    # --- limits -------------------------------------------------------------------------

    def update_limits(self, *, keys: dict[str, KeyLimits], default: KeyLimits | None = None) -> None:
        """Per-key limits (and, if given, the default) for requests admitted from now on.

        Streams already admitted run on with their reservations; buckets of keys whose limits
        did not change keep their level (a reload is no free refill). Queue sizes and classes
        stay as configured at startup."""
        admission = self.config.admission
        default = admission.default if default is None else default
        self._admission.update_limits(default, keys)
        self.config = self.config.model_copy(update={"admission": self._admission.config})
        logger.info("key limits updated: %d per-key override(s), default %s", len(keys),
                    default.model_dump(exclude_none=True) or "unlimited")

    # --- requests -----------------------------------------------------------------------

    def stream(self, request: GenerateRequest, *, model: str | None = None, key: str | None = None,
               deadline: float | None = None) -> RoutedStream:
        """A RoutedStream for `request` on a worker of `model`; `key` is the API key admission
        charges; `deadline` an absolute `loop.time()`.

        Raises right away: InvalidRequestError for a request with no inputs, or when `model` is
        None and workers of several models are known; UnknownModelError when `model` is not the
        model of any worker whose Info is known (serving or not). While no worker's Info is
        known yet (none has answered), any model is let through, and the stream's first
        `__anext__` raises NoWorkerError instead. Every other refusal comes from the first
        `__anext__` (or `admit()`)."""
        if not request.inputs:
            raise InvalidRequestError("the request has no inputs", param="prompt")
        if request.hints.service_class not in SERVICE_CLASSES:
            raise InvalidRequestError(f"service class {request.hints.service_class!r} is not one of "
                                      f"{', '.join(SERVICE_CLASSES)}", param="service_class")
        admission = self.config.admission
        request, model = self._resolve_adapter(request, model)
        self._check_generates(model)
        features = features_of(
            request, model=model, prefix_chars=self.config.prefix_chars,
            default_max_tokens=self.config.default_max_tokens, long_prompt_tokens=admission.long_prompt_tokens,
            long_max_tokens=admission.long_max_tokens, class_pools=admission.class_pools,
            class_pool_fallback=admission.class_pool_fallback, ticket=next(self._tickets),
        )
        return RoutedStream(self._context, request, features, key=key, deadline=deadline)

    async def pool(self, request: PoolRequest, *, model: str | None, key: str | None = None,
                   deadline: float | None = None) -> PoolAnswer:
        """Route one pooling request (router/pooling.py) to a worker of `model` whose model serves
        its endpoint, failing over while workers fail it. Raises UnknownModelError for a model no
        worker serves, InvalidRequestError for a model that does not serve the endpoint (naming
        its tasks), RateLimitedError, NoWorkerError, or the worker's error."""
        model = self._resolve_model(model)
        infos = self._infos(model)
        serving = {address for address, info in infos.items() if request.endpoint in info.pooling_endpoints}
        if infos and not serving:
            path = ENDPOINT_PATHS.get(request.endpoint, request.endpoint)
            raise InvalidRequestError(f"model {model!r} does not serve {path}: {_task_of(infos)}",
                                      param="model")
        return await route_pool(self._context, request, model=model or "", serving=serving, key=key,
                                deadline=deadline, ticket=next(self._tickets))

    def _infos(self, model: str | None) -> dict[str, WorkerInfo]:
        """Info of every worker of `model` that answered Info, by address."""
        infos = {}
        for view in self._pool.snapshot():
            worker = self._pool.worker(view.address)
            if worker is not None and worker.info is not None and worker.info.model == model:
                infos[view.address] = worker.info
        return infos

    def _check_generates(self, model: str | None) -> None:
        """A generation request to a model whose workers only pool is refused, naming its task."""
        infos = self._infos(model)
        if infos and not any(info.generates for info in infos.values()):
            raise InvalidRequestError(f"model {model!r} does not generate text: {_task_of(infos)}", param="model")

    def _resolve_adapter(self, request: GenerateRequest, model: str | None) -> tuple[GenerateRequest, str | None]:
        """The model to route to; one that names a LoRA adapter (not a served model) runs as
        that adapter on its base model. Looked up only for a name that is no served model."""
        try:
            return request, self._resolve_model(model)
        except UnknownModelError:
            base = self.adapters.base_of(model or "")
            if base is None:
                raise
            return dataclasses.replace(request, adapter=model), base

    def _resolve_model(self, model: str | None) -> str | None:
        known = self._pool.snapshot().known_models()
        if model is None:
            if len(known) > 1:
                raise InvalidRequestError(f"name a model: this pool serves {', '.join(known)}", param="model")
            return known[0] if known else None
        if known and model not in known:
            raise UnknownModelError(f"model {model!r} is not served here; available: {', '.join(known)}", model=model)
        return model


def _task_of(infos: dict[str, WorkerInfo]) -> str:
    """What a model's workers do, for a refusal: its vLLM tasks and the endpoints it serves."""
    tasks = sorted({task for info in infos.values() for task in (info.tasks or ["generate"])})
    pooling = sorted({e for info in infos.values() for e in info.pooling_endpoints})
    what = f"its task is {', '.join(tasks)}"
    if pooling:
        return what + f"; it serves {', '.join(ENDPOINT_PATHS.get(e, e) for e in pooling)}"
    return what + "; it serves /v1/chat/completions and /v1/completions"
