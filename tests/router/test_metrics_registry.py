"""Each registry gets its own router and quota metrics, even when a dropped registry's memory is
reused for a new one (CPython hands out a freed object's id again)."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.quota.metrics import QuotaMetrics


def test_a_new_registry_never_gets_the_metrics_of_a_dropped_one():
    # A dropped registry's memory is usually handed to the next one within a few rounds (CPython's
    # allocator), which is what a cache keyed by address would get wrong. Each round's full
    # collection costs ~0.7 s with torch loaded: 10 rounds, not 50.
    for _ in range(10):
        registry = CollectorRegistry()
        RouterMetrics.for_registry(registry).rejections.labels("requests_per_min").inc()
        assert registry.get_sample_value("vllm_fleet_router_rejections_total", {"reason": "requests_per_min"}) == 1
        QuotaMetrics.for_registry(registry)
        assert QuotaMetrics.for_registry(registry) is QuotaMetrics.for_registry(registry)
        del registry
        gc.collect()
