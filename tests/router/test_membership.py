"""Registry changes reach the pool, including from another thread (ZooKeeper calls back from its own)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig

FAST = dict(load_poll_interval_s=0.2, health_poll_interval_s=0.2)


async def test_workers_join_and_leave_as_the_registry_changes(mock_worker_factory):
    a = await mock_worker_factory.start(mock_tokens_per_s=200)
    b = await mock_worker_factory.start(mock_tokens_per_s=200)
    registry = StaticRegistry([WorkerRecord(address=a.address)])
    router = Router(registry, RouterConfig(**FAST), metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await router.wait_ready(timeout=30)
        # A change announced from another thread must be applied in the router's loop.
        await asyncio.to_thread(registry.set_workers, [WorkerRecord(address=a.address), WorkerRecord(address=b.address)])
        await wait_until(lambda: [w.address for w in router.snapshot().eligible()] == sorted([a.address, b.address]),
                         timeout=30, message="joined worker serving")
        assert sorted(w.address for w in router.snapshot().eligible()) == sorted([a.address, b.address])
        registry.set_workers([WorkerRecord(address=b.address)])
        await wait_until(lambda: [w.address for w in router.snapshot()] == [b.address], timeout=10,
                         message="left worker gone from the pool")
        assert a.address not in [w.address for w in router.snapshot()]
    finally:
        await router.close()
        a.stop(timeout=10)
        b.stop(timeout=10)
