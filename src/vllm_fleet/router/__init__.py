"""The routing core: which worker serves a request, and what happens when one fails.

    from vllm_fleet.router import Router, RouterConfig, AdmissionConfig, KeyLimits, RoutedStream

    router = Router(registry, RouterConfig(policy="least_outstanding"), pool=None)  # pool: ClientPool
    # connect=fn: fn(address) -> the client streams go through (default pool.get; tests pass a fake)
    await router.start()                   # start the registry; Info, health and Load of each worker
    await router.wait_ready(timeout=30.0)  # some worker SERVING, else NoWorkerError
    router.models()                        # models of serving workers
    router.model_info(model)               # WorkerInfo (max_model_len, ...) or None
    router.snapshot()                      # PoolSnapshot: per worker state, breaker, load, in flight
    router.queue_depths()                  # requests waiting for a slot, per workload class
    router.batch_wait_status()             # BatchWaitStatus: batch waiting for slack, since when, why

    stream = router.stream(request, model="m", key="api-key", deadline=loop.time() + 30)
    await stream.admit()                   # optional: raise RateLimitedError before committing to a reply
    async for chunk in stream: ...         # Chunks as the worker sends them, across failover/migration
    stream.worker, stream.attempts, stream.migrations
    await stream.aclose()                  # or cancel the task: aborts the worker request
    await router.close()

Errors (all from vllm_fleet.errors):
    router.stream(...)        UnknownModelError (404) for a model no known worker has (while no
                              worker has answered yet, the first __anext__ raises NoWorkerError);
                              InvalidRequestError when several models are served and none is named.
    first __anext__/admit()   RateLimitedError(retry_after, reason) from admission (key budgets,
                              class queue full or timed out); NoWorkerError(retry_after) when no
                              worker can take it; InvalidRequestError from the worker (never
                              retried); the last WorkerError when attempts or the retry budget ran out.
    later __anext__           the last WorkerError when a stream could not be migrated.
    any __anext__             DeadlineExceededError (a WorkerTimeoutError) once `deadline` passed.

Admission applies to every request's workload class (short/long, bounded queues when
`*_max_in_flight` is set) and, when `key` is given and key limits are configured, to the key's
request and token buckets. Session affinity keys on `request.session_id` (the gateway puts the
OpenAI `user` there when no session is given).

Modules of the room (router/):
    router     the Router facade: resolves the model, estimates the request, makes streams
    stream     RoutedStream: one request's attempts, failover before the first token, migration after
    context    StreamContext: the frozen bundle a stream gets instead of the router
    attempt_hooks  AttemptHooks: the one seam for concerns around an attempt (prepare, picking,
               routed, first_token, chunk, attempt_ended, ended); cache/hook, classes/batch_hook
               and adapters.AdapterHook implement it
    pick       which worker the next attempt goes to, and the lease that claims it
    retry      whether another attempt follows a failed one
    delivered  what the caller has of each sample; the request that resumes after it
    watchdog   stall detection for one attempt's stream
    budget     the retry budget
    features   what routing and admission need to know about a request, computed once
    policies   routing policies: pure ranking functions over a pool snapshot (and, for
               cache_aware, the cache match: cache/match)
    config     settings and their CLI options
    metrics    Prometheus metrics of the routing core
    pooling    routing one pooling request (embeddings, score, rerank, classify), with failover
    unary      one short call to any worker of a model, with failover (introspection routes)
    adapters   LoRA placement: which workers hold an adapter, loading it where needed (AdapterHook)

Wings (each __init__ lists its modules):
    pool/      membership (Pool), worker (WorkerState), lease, listener (PoolListener),
               snapshot (PoolSnapshot, WorkerView), breaker, ejection (outliers)
    cache/     routing (CacheRouting), hook (CacheHook), match (CacheMatch), index (CacheIndex),
               routed_holds, entries, follower (KV events), block_keys, key_memo, prefix_reuse
    prompt/    tokenizers (the prompt's ids at the router), chat_render, segments, head_cut
    classes/   service_class (settings and rules), batch_gate, batch_hook, batch_wait
    quota/     admission (buckets, class queues), key_limiter, shared_buckets, fleet, bucket,
               store, metrics

The request path: router.stream() resolves the model and estimates the request, then hands a
RoutedStream the router's StreamContext; the stream admits, ranks workers, leases one, streams
through `connect(address)`, reports the outcome to the pool, and fails over or migrates. What
acts around each attempt (cache holds and ids, the batch gate, adapter placement) is one of the
context's attempt hooks, called at fixed points; the stream names none of them.
Imports run one way: router -> stream -> context -> (pool, policies, quota, budget, ...), the
hooks -> attempt_hooks, and no wing imports the room's facade. The pool knows no other wing: the Router registers the batch
gate and cache routing on it as PoolListeners (pool/listener.py).

Migration of n>1 requests: each unfinished sample is re-sent as its own input with n=1 and
its tokens so far as `resume_token_ids`; chunks are mapped back to the original (index, sample).
"""

from vllm_fleet.router.config import (
    AdmissionConfig,
    KeyLimits,
    RouterConfig,
    add_router_options,
    router_config_from_args,
)
from vllm_fleet.router.classes.batch_wait import BatchWaitStatus
from vllm_fleet.router.router import Router
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView
from vllm_fleet.errors import DeadlineExceededError  # re-exported: the stream raises it
from vllm_fleet.router.stream import RoutedStream

__all__ = [
    "AdmissionConfig",
    "BatchWaitStatus",
    "DeadlineExceededError",
    "KeyLimits",
    "PoolSnapshot",
    "RoutedStream",
    "Router",
    "RouterConfig",
    "WorkerView",
    "add_router_options",
    "router_config_from_args",
]
