"""Prometheus metrics of the gateway, and the pool's state read from the router at scrape time.

The gateway and its router share one registry per gateway (tests run several gateways in one
process without mixing series). Per-worker gauges are not updated on the hot path: they are
read from `router.snapshot()` when Prometheus scrapes. With `--processes N` a scrape answers for
all N processes: the one that takes it merges its siblings' figures into its own (siblings.py,
metrics_merge.py).
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from vllm_fleet.gateway.metrics_merge import merge_expositions
from vllm_fleet.gateway.siblings import Siblings
from vllm_fleet.router import Router

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)


class GatewayMetrics:
    def __init__(self, router: Router, registry: CollectorRegistry, siblings: Siblings | None = None) -> None:
        self.registry = registry
        self.siblings = siblings
        r = registry
        self.requests = Counter("vllm_fleet_gateway_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("vllm_fleet_gateway_time_to_first_token_seconds",
                              "From request arrival to the first token sent", ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm_fleet_gateway_inter_token_latency_seconds",
                             "Time between streamed tokens (a coalesced chunk's gap split over its tokens)",
                             ["model"], buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm_fleet_gateway_request_duration_seconds",
                             "From request arrival to the last byte sent", ["model", "endpoint"],
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("vllm_fleet_gateway_tokens", "Tokens in (prompt) and out (completion)",
                              ["model", "direction"], registry=r)
        self.rejections = Counter("vllm_fleet_gateway_rejections", "Requests refused, by reason",
                                  ["reason"], registry=r)
        self.in_progress = Gauge("vllm_fleet_gateway_requests_in_progress", "Requests being served now", registry=r)
        r.register(_LoadCollector(router))
        r.register(_TaskCollector())
        # Plain totals for the dashboard's request rates (cheaper to read than the registry).
        self.totals: dict[str, int] = {"requests": 0, "errors": 0, "completion_tokens": 0}
        self._children: dict[tuple, object] = {}

    def reject(self, reason: str) -> None:
        self.child(self.rejections, reason).inc()

    def child(self, metric, *labels: str):
        """`metric.labels(*labels)`, cached: prometheus_client's lookup costs microseconds per call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def settle(self, model: str, stream, record, *, prompt_tokens: int, completion_tokens: int) -> None:
        """What every generating endpoint keeps of an answered request (RoutedStream `stream`):
        the access-log record's worker, attempts and token counts, and the token and TTFT metrics."""
        record.worker, record.attempts, record.migrations = stream.worker, stream.attempts, stream.migrations
        record.prompt_tokens, record.completion_tokens = prompt_tokens, completion_tokens
        if prompt_tokens:
            self.child(self.tokens, model, "prompt").inc(prompt_tokens)
        if completion_tokens:
            self.child(self.tokens, model, "completion").inc(completion_tokens)
        if record.ttft_s is not None:
            self.child(self.ttft, model).observe(record.ttft_s)

    def render(self) -> bytes:
        """This process's own metrics."""
        return generate_latest(self.registry)

    async def render_gateway(self) -> bytes:
        """The whole gateway's metrics: this process's, merged with its siblings' when there are any."""
        own = self.render()
        if self.siblings is None:
            return own
        others = await self.siblings.ask("metrics")
        return merge_expositions([own, *others], extra=_process_gauges(self.siblings.processes, 1 + len(others)))


def _process_gauges(processes: int, answered: int) -> list[GaugeMetricFamily]:
    return [GaugeMetricFamily("vllm_fleet_gateway_processes", "Gateway processes serving this port (--processes)",
                              value=processes),
            GaugeMetricFamily("vllm_fleet_gateway_processes_answered",
                              "Gateway processes whose figures this scrape includes (fewer while one restarts)",
                              value=answered)]


class _LoadCollector:
    """Each worker's own Load report (running, waiting, KV cache), read at scrape time.

    Breaker state, in-flight, serving, queue depth, retries and migrations come from the
    router's metrics, which live in the same registry.
    """

    def __init__(self, router: Router) -> None:
        self.router = router

    def describe(self):
        return []

    def collect(self):
        labels = ["worker", "model"]
        running = GaugeMetricFamily("vllm_fleet_worker_running", "Sequences the worker runs (its Load)", labels=labels)
        waiting = GaugeMetricFamily("vllm_fleet_worker_waiting", "Sequences waiting on the worker (its Load)", labels=labels)
        kv = GaugeMetricFamily("vllm_fleet_worker_kv_cache_usage", "KV-cache usage 0..1 (its Load)", labels=labels)
        rate = GaugeMetricFamily("vllm_fleet_worker_output_tokens_per_second", "Output tokens/s (its Load)", labels=labels)
        for w in self.router.snapshot():
            if w.load is None:
                continue
            values = [w.address, w.model or "unknown"]
            running.add_metric(values, w.load.running)
            waiting.add_metric(values, w.load.waiting)
            kv.add_metric(values, w.load.kv_cache_usage)
            rate.add_metric(values, w.load.output_tokens_per_s)
        yield from (running, waiting, kv, rate)


class _TaskCollector:
    """asyncio tasks alive in the gateway's loop, counted at scrape time (a leak shows as drift)."""

    def describe(self):
        return []

    def collect(self):
        try:
            count = len(asyncio.all_tasks())
        except RuntimeError:  # scraped outside the loop (a test calling render() directly)
            return
        tasks = GaugeMetricFamily("vllm_fleet_gateway_asyncio_tasks", "asyncio tasks alive in the gateway's event loop")
        tasks.add_metric([], count)
        yield tasks
