"""cache_aware in front of workers that relay no KV-cache events (vLLM's default since #49) says so."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from vllm_fleet.protocol.types import WorkerInfo
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.cache.routing import CacheRouting
from vllm_fleet.router.metrics import RouterMetrics


def _info(kv_events: bool) -> WorkerInfo:
    return WorkerInfo(model="m", max_model_len=4096, engine="vllm", engine_version="0.32.0",
                      kv_events=kv_events, kv_block_size=16 if kv_events else 0)


def test_a_worker_without_events_is_named_once_with_the_option_that_fixes_it(caplog):
    cache = CacheRouting(RouterConfig(policy="cache_aware"), lambda address: None,
                         RouterMetrics.for_registry(CollectorRegistry()))
    with caplog.at_level(logging.WARNING, logger="vllm_fleet.router.cache.routing"):
        for _ in range(3):  # Info comes again at every reconnect: one line, not one per Info
            assert cache.on_info("10.0.0.1:50051", _info(kv_events=False), lambda: "m") is None
    told = [r.getMessage() for r in caplog.records if "10.0.0.1:50051" in r.getMessage()]
    assert len(told) == 1 and "--kv-events" in told[0]
    assert "10.0.0.1:50051" not in cache.followers


def test_a_worker_with_events_is_followed_without_a_warning(caplog):
    cache = CacheRouting(RouterConfig(policy="cache_aware"), lambda address: None,
                         RouterMetrics.for_registry(CollectorRegistry()))
    with caplog.at_level(logging.WARNING, logger="vllm_fleet.router.cache.routing"):
        follower = cache.on_info("10.0.0.2:50051", _info(kv_events=True), lambda: "m")
    assert follower is not None and "10.0.0.2:50051" in cache.followers
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
