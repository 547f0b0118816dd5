"""The router counts the prompt tokens it sends to a worker that another worker's cache held
more of: the prefill a decision for load costs, which an SRE compares with the hit rate."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from vllm_fleet.router import RouterConfig
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.cache.routing import CachePrompt, CacheRouting
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.metrics import RouterMetrics


def copied_metric(registry: CollectorRegistry, worker: str) -> float:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("copied_prompt_tokens_total") and sample.labels.get("worker") == worker:
                return sample.value
    return 0.0


def routing_with(fresh: set[str]) -> tuple[CacheRouting, CollectorRegistry]:
    registry = CollectorRegistry()
    routing = CacheRouting(RouterConfig(policy="cache_aware"), lambda address: None,
                           RouterMetrics.for_registry(registry))
    routing.fresh = lambda address: address in fresh  # whose events are followed in order
    return routing, registry


def features(cached: dict[str, int]) -> tuple[RequestFeatures, CachePrompt]:
    """A 400-token prompt (25 blocks) of which each worker in `cached` held that many leading tokens."""
    return RequestFeatures(model="m", prompt_tokens=400), CachePrompt(tuple(range(25)), 400,
                                                                      match=CacheMatch(cached_tokens=cached))


def test_a_request_sent_away_from_the_worker_holding_more_counts_what_it_prefills_again():
    routing, registry = routing_with({"a", "b"})
    routing.routed("a", *features({"a": 320, "b": 64}))          # to the holder: nothing copied
    assert copied_metric(registry, "a") == 0 and routing.stats()["copied_tokens"] == {"a": 0}
    routing.routed("b", *features({"a": 320, "b": 64}))          # away from it: 256 tokens again
    routing.routed("b", *features({"a": 320}))                   # and from nothing held: 320
    assert copied_metric(registry, "b") == 576
    assert routing.stats()["copied_tokens"] == {"a": 0, "b": 576}
    assert routing.copied_share("b") == 576 / 800 and routing.copied_share("a") == 0.0  # the dashboard's


def test_blocks_of_a_worker_whose_events_are_stale_are_not_counted_as_held():
    # A stale index may promise blocks the engine freed long ago: going elsewhere copies nothing known.
    routing, registry = routing_with({"b"})
    routing.routed("b", *features({"a": 320, "b": 64}))
    assert copied_metric(registry, "b") == 0 and routing.stats()["copied_tokens"] == {"b": 0}
