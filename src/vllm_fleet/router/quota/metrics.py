"""Prometheus metrics of the fleet-wide quota (router/quota/fleet.py), in the gateway's registry.

    vllm_fleet_quota_fallback        1 while this gateway admits from its local share (ZooKeeper unreachable)
    vllm_fleet_quota_gateways        gateways sharing the quota, as last seen in ZooKeeper
    vllm_fleet_quota_leases_total    leases by result: granted, refused, returned, unavailable

One QuotaMetrics exists per prometheus registry, as for RouterMetrics.
"""

from __future__ import annotations

import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

# Keyed by the registry itself, held weakly: keyed by id(), a registry made after another was
# dropped could reuse its id and be handed the dropped one's metrics (whose counts it never sees).
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, QuotaMetrics] = weakref.WeakKeyDictionary()


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        common = {"namespace": "vllm_fleet", "subsystem": "quota", "registry": registry}
        self.fallback = Gauge("fallback", "1 while this gateway admits keys from its local share of their limits "
                              "because ZooKeeper does not answer, else 0", **common)
        self.gateways = Gauge("gateways", "Gateways sharing the fleet-wide quota, as last seen in ZooKeeper", **common)
        self.leases = Counter("leases", "Quota leases by result (granted, refused, returned, unavailable)",
                              ["result"], **common)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> QuotaMetrics:
        registry = registry or REGISTRY
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = _by_registry[registry] = cls(registry)
        return metrics
