"""Prometheus metrics of the routing core. The gateway exports them from the same registry.

Counters count events (retries, migrations, rejections); per-worker and per-class gauges are
read when Prometheus scrapes (`set_function`), so the hot path never updates them.
One RouterMetrics exists per prometheus registry: two routers in one process share it.
"""

from __future__ import annotations

import weakref

from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

BREAKER_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}

# Keyed by the registry itself, held weakly: keyed by id(), a registry made after another was
# dropped could reuse its id and be handed the dropped one's metrics (whose counts it never sees).
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, RouterMetrics] = weakref.WeakKeyDictionary()


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        common = {"namespace": "vllm_fleet", "subsystem": "router", "registry": registry}
        self.requests = Counter("requests", "Requests routed, by model and outcome (ok, error, rejected, cancelled)",
                                ["model", "outcome"], **common)
        self.retries = Counter("retries", "Extra worker attempts (failovers + migrations), by cause", ["reason"], **common)
        self.failovers = Counter("failovers", "Requests moved to another worker before their first token", **common)
        self.withdrawals = Counter("batch_withdrawals", "Batch requests withdrawn before their first token for "
                                   "interactive work, and requeued", **common)
        self.pauses = Counter("batch_pauses", "Running batch requests paused for interactive work (their tokens "
                              "kept) and requeued to resume where they stopped", **common)
        self.batch_cuts = Counter("batch_cap_cuts", "Interactive latency misses that halved a worker's batch cap "
                                  "(router/classes/batch_gate.py), by worker, by the signal that missed (ttft, itl, both) "
                                  "and by whose samples showed it (router: this router's own; worker: the "
                                  "worker's latency report)", ["worker", "signal", "source"], **common)
        self._cut_labels: set[tuple[str, str, str]] = set()  # the children of batch_cuts, to forget a worker's
        self.migrations = Counter("migrations", "Streams continued on another worker after tokens were sent", **common)
        self.rejections = Counter("rejections", "Requests refused, by reason (requests_per_min, tokens_per_min, "
                                  "queue_full, queue_timeout, no_worker, retry_budget)", ["reason"], **common)
        self.panics = Counter("panics", "Attempts routed in panic mode: every worker of the model was out of "
                              "rotation (open breaker or ejected), so one was used regardless", **common)
        self.worker_failures = Counter("worker_failures", "Failed attempts, by worker and error", ["worker", "error"], **common)
        self.breaker_state = Gauge("breaker_state", "Circuit breaker per worker: 0 closed, 1 half-open, 2 open",
                                   ["worker"], **common)
        self.in_flight = Gauge("in_flight", "Requests this router has open per worker", ["worker"], **common)
        self.outstanding_tokens = Gauge("outstanding_tokens", "Tokens still expected per worker", ["worker"], **common)
        self.worker_up = Gauge("worker_serving", "1 when the worker takes new requests, else 0", ["worker"], **common)
        self.predicted_cached_tokens = Counter(
            "predicted_cached_tokens", "Prompt tokens the cache index expected each worker to hold, of the requests "
            "routed there (cache_aware)", ["worker"], **common)
        self.routed_prompt_tokens = Counter(
            "routed_prompt_tokens", "Prompt tokens routed to each worker (cache_aware; the denominator of predicted "
            "hits)", ["worker"], **common)
        self.copied_prompt_tokens = Counter(
            "copied_prompt_tokens", "Prompt tokens routed to a worker that another worker's cache held more of "
            "(cache_aware): prefill a placement by cache alone would not do, spent for load (the bounded-load guard "
            "or the load term); with routed_prompt_tokens, how far routing falls short of the best hit rate",
            ["worker"], **common)
        self.prompt_ids_mismatches = Counter(
            "prompt_ids_mismatches", "Requests whose prompt the router tokenized to another length than the worker "
            "ran (cache_aware: its cache lookups for them are off)", **common)
        self.kv_events_fresh = Gauge("kv_events_fresh", "1 while the worker's KV-cache events are followed in order; "
                                     "0: scored by load alone", ["worker"], **common)
        self.engine_prefix_hits = Gauge("engine_prefix_cache_hits", "The engine's own prefix-cache hit tokens "
                                        "(lifetime, from its Load)", ["worker"], **common)
        self.engine_prefix_queries = Gauge("engine_prefix_cache_queries", "The engine's own prefix-cache queried "
                                           "tokens (lifetime, from its Load)", ["worker"], **common)
        # Counted up and down (not read at scrape): two routers sharing a registry add up.
        self.batch_waiting = Gauge("batch_waiting", "Batch requests waiting for a worker with slack (why: the "
                                   "router's log, Router.batch_wait_status())", **common)
        self.queue_depth = Gauge("queue_depth", "Requests waiting for a slot, by workload class", ["workload_class"],
                                 **common)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> RouterMetrics:
        registry = registry or REGISTRY
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = _by_registry[registry] = cls(registry)
        return metrics

    def watch_worker(self, address: str, *, breaker: Callable[[], str], in_flight: Callable[[], int],
                     outstanding: Callable[[], int], serving: Callable[[], bool]) -> None:
        self.breaker_state.labels(address).set_function(lambda: BREAKER_VALUES.get(breaker(), 0.0))
        self.in_flight.labels(address).set_function(lambda: float(in_flight()))
        self.outstanding_tokens.labels(address).set_function(lambda: float(outstanding()))
        self.worker_up.labels(address).set_function(lambda: 1.0 if serving() else 0.0)

    def watch_cache(self, address: str, *, fresh: Callable[[], bool], hits: Callable[[], int],
                    queries: Callable[[], int]) -> None:
        self.kv_events_fresh.labels(address).set_function(lambda: 1.0 if fresh() else 0.0)
        self.engine_prefix_hits.labels(address).set_function(lambda: float(hits()))
        self.engine_prefix_queries.labels(address).set_function(lambda: float(queries()))

    def forget_worker(self, address: str) -> None:
        for gauge in (self.breaker_state, self.in_flight, self.outstanding_tokens, self.worker_up,
                      self.kv_events_fresh, self.engine_prefix_hits, self.engine_prefix_queries,
                      self.predicted_cached_tokens, self.routed_prompt_tokens):
            try:
                gauge.remove(address)
            except KeyError:
                pass
        for labels in [labels for labels in self._cut_labels if labels[0] == address]:
            self.batch_cuts.remove(*labels)
            self._cut_labels.discard(labels)

    def count_cut(self, address: str, signal: str, source: str) -> None:
        """One cut of a worker's batch cap (batch_gate.BatchGate's on_cut)."""
        self._cut_labels.add((address, signal, source))
        self.batch_cuts.labels(address, signal, source).inc()

    def watch_queue(self, workload_class: str, depth: Callable[[], int]) -> None:
        self.queue_depth.labels(workload_class).set_function(lambda: float(depth()))
