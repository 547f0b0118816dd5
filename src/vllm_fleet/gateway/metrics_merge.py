"""One Prometheus exposition for N gateway processes, from each process's own.

Counters and histograms add up: the gateway served what its processes served. Gauges depend on
what they count:
- what each process holds for itself (requests in progress, in-flight per worker, queue depth,
  asyncio tasks) adds up too;
- what every process observes of the same outside thing (a worker's Load report, whether a
  worker serves, a breaker's state, the fleet quota's view) is taken at its highest: the worst
  breaker state any process has, 1 if any process routes to the worker.
A `*_created` series (when a counter started) takes the earliest.

Every gauge the gateway registers is named in one of the two sets below, so that a new gauge
cannot be merged the wrong way unnoticed (tests/gateway/test_metrics_merge.py checks this).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# Gauges of what each process holds for itself: the gateway's value is the sum.
SUMMED_GAUGES = frozenset({
    "vllm_fleet_gateway_requests_in_progress",
    "vllm_fleet_gateway_asyncio_tasks",
    "vllm_fleet_router_in_flight",
    "vllm_fleet_router_outstanding_tokens",
    "vllm_fleet_router_queue_depth",
    "vllm_fleet_router_batch_waiting",
    "vllm_fleet_gateway_batch_lines_in_flight",  # a batch runs in one process (its lease holder)
    "vllm_fleet_gateway_batches_running",
})
# Gauges of what all processes observe alike: the gateway's value is the highest.
HIGHEST_GAUGES = frozenset({
    "vllm_fleet_worker_running",
    "vllm_fleet_worker_waiting",
    "vllm_fleet_worker_kv_cache_usage",
    "vllm_fleet_worker_output_tokens_per_second",
    "vllm_fleet_router_breaker_state",
    "vllm_fleet_router_worker_serving",
    "vllm_fleet_quota_fallback",
    "vllm_fleet_quota_gateways",
    # cache_aware: each process follows every worker's events itself; the engines' counters are theirs
    "vllm_fleet_router_kv_events_fresh",
    "vllm_fleet_router_engine_prefix_cache_hits",
    "vllm_fleet_router_engine_prefix_cache_queries",
})


def _combine(family: Metric):
    if family.type == "gauge":
        if family.name.endswith("_created"):
            return min
        if family.name in HIGHEST_GAUGES:
            return max
        if family.name in SUMMED_GAUGES:
            return _add
        raise KeyError(f"gauge {family.name} has no merge rule in metrics_merge.py")
    return _add  # counter, histogram, summary, untyped: events that add up


def _add(a: float, b: float) -> float:
    return a + b


def merge_expositions(texts: Iterable[bytes], *, extra: Iterable[Metric] = ()) -> bytes:
    """The text exposition of all `texts` merged (families in first-seen order), then `extra`."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            combine = _combine(family)
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = combine(samples[key], sample.value) if key in samples else sample.value
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*families.values(), *extra]))
    return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self):
        return self.families
