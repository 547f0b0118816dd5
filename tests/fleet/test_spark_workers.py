"""Workers in a Spark application's lifetime: real local Spark, real ZooKeeper, mock engine."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.config import EngineConfig
from vllm_fleet.fleet.config import SupervisorConfig
from vllm_fleet.fleet.spark_workers import start_spark_workers


async def _serving(address: str) -> bool:
    async with WorkerClient(address) as client:
        return await client.health(timeout=1) == "SERVING"


async def _unreachable(address: str) -> bool:
    async with WorkerClient(address) as client:
        return await client.health(timeout=1) == "UNREACHABLE"


async def test_one_worker_per_task_registered_then_stopped_with_the_job(spark, zookeeper):
    url = f"zk://{zookeeper.hosts}/spark-{uuid.uuid4().hex[:6]}"
    handle = start_spark_workers(
        spark, registry=url, num_workers=2, engine=EngineConfig(engine="mock"),
        supervisor=SupervisorConfig(health_interval_s=0.5, stop_grace_s=5),
        engine_for=lambda partition: EngineConfig(engine="mock", cpu_cores=str(partition)),
    )
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.run_in_executor(None, handle.wait_registered, 120)
        assert len(addresses) == 2
        for address in addresses:
            assert await _serving(address)
    finally:
        await loop.run_in_executor(None, handle.stop, 60)
    assert sorted(handle.result()) == addresses
    assert handle.addresses() == []
    for address in addresses:
        await wait_until(lambda: _unreachable(address), timeout=15, message=f"{address} stopped with the job")
