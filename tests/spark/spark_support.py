"""Helpers for the Spark tests: answers straight from a worker, to compare Spark's against."""

from __future__ import annotations

import asyncio

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import ChatMessage, GenerateInput


async def client_answers(address: str, inputs: list[GenerateInput], params: dict, *,
                         concurrency: int = 16) -> list[str]:
    """What the async client gets for each input on its own, from the worker at `address`."""
    client = WorkerClient(address)
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int, item: GenerateInput) -> str:
        async with slots:
            request = build_request(request_id=f"direct-{index}", inputs=[item], params=SamplingParams(**params))
            return "".join([chunk.text async for chunk in client.generate(request, timeout=120)])

    try:
        return list(await asyncio.gather(*(one(i, item) for i, item in enumerate(inputs))))
    finally:
        await client.close()


def chat(*pairs: tuple[str, str]) -> GenerateInput:
    return GenerateInput(messages=[ChatMessage(role=r, content=c) for r, c in pairs])


def run_in_thread(function):
    """Start `function()` in a thread (a Spark action blocks); returns a future."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(function)
    pool.shutdown(wait=False)
    return future
