"""Row-level retries on a mock worker, without Spark: a copy of a running request waits for it."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router
from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.config import build_config


async def test_a_retried_task_waits_for_its_first_attempt_instead_of_failing_the_row(mock_worker_factory):
    worker = await mock_worker_factory.start(mock_tokens_per_s=100, mock_ttft_ms=5)
    config = build_config(prompt_col="p", workers=[worker.address], params={"max_tokens": 30}, retry_backoff_s=0.2,
                          row_attempts=10)
    router = Router(StaticRegistry.from_spec(worker.address), config.router_config(), metrics_registry=CollectorRegistry())
    client = WorkerClient(worker.address)
    await router.start()
    try:
        await router.wait_ready(10)
        item = GenerateInput(text="the same row sent twice")
        first = GenerateRequest(request_id="spk-row-1", inputs=[item], params=SamplingParams(max_tokens=30))
        chunks = client.generate(first, timeout=30)
        head = await chunks.__anext__()  # the first attempt is running on the worker now
        copy = asyncio.ensure_future(Answerer(router, config).answer(item, "spk-row-1"))
        rest = [c async for c in chunks]
        result = await copy
    finally:
        await client.close()
        await router.close()

    assert result.error is None, result.error
    assert result.attempts > 1, "the worker refused the copy while the first attempt ran"
    assert result.output == head.text + "".join(c.text for c in rest), "then it ran, with the same answer"
