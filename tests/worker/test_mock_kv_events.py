"""KV-cache events end to end on the mock engine's simulated prefix cache (--mock-kv-blocks)."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import KvEventsUnsupportedError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.protocol.kv_events import BlocksStored

BS = 16
PARAMS = SamplingParams(temperature=0.0, max_tokens=2)


@pytest.fixture(scope="module")
async def client(module_mock_workers):
    worker = await module_mock_workers.start(mock_tokens_per_s=400, mock_ttft_ms=5, mock_kv_blocks=64)
    client = WorkerClient(worker.address)
    yield client
    await client.close()


async def cached_tokens(client: WorkerClient, request_id: str, token_ids: list[int], *,
                        cache_salt: str | None = None) -> int:
    extra = {"cache_salt": cache_salt} if cache_salt is not None else None
    chunks = [c async for c in client.generate(build_request(request_id, [GenerateInput(token_ids=token_ids)],
                                                             PARAMS, extra_body=extra), timeout=60)]
    return next(c.usage.cached_tokens for c in chunks if c.finish_reason)


def stored(batch) -> list[BlocksStored]:
    return [e for e in batch.events if isinstance(e, BlocksStored)]


async def test_requests_sharing_a_prefix_show_stored_blocks_cached_tokens_and_a_late_snapshot(client):
    info = await client.info()
    assert info.kv_events and info.kv_block_size == BS
    events = client.kv_events()
    first = await asyncio.wait_for(anext(events), 30)
    assert first.snapshot and first.block_size == BS
    shared = [4 + i for i in range(32)]  # two full blocks (the mock's vocabulary is 44 tokens)

    assert await cached_tokens(client, "kv-a", shared + [5] * 8) == 0
    batch_a = await asyncio.wait_for(anext(events), 30)
    (a,) = stored(batch_a)
    assert len(a.block_hashes) == 2 and a.token_ids == tuple(shared) and a.parent_block_hash is None
    assert batch_a.epoch == first.epoch and batch_a.sequence == first.sequence + 1

    assert await cached_tokens(client, "kv-b", shared + list(range(10, 28))) == 2 * BS
    batch_b = await asyncio.wait_for(anext(events), 30)
    (b,) = stored(batch_b)
    assert b.parent_block_hash == a.block_hashes[-1] and b.token_ids == tuple(range(10, 26))
    await events.aclose()

    load = await client.load()
    assert load.prefix_cache_hits >= 2 * BS and load.prefix_cache_queries >= 40 + 50

    late = client.kv_events()
    snapshot = await asyncio.wait_for(anext(late), 30)
    assert snapshot.snapshot and snapshot.sequence == batch_b.sequence
    held = [h for e in stored(snapshot) for h in e.block_hashes]
    assert held[:3] == [*a.block_hashes, *b.block_hashes]
    await late.aclose()

    resumed = client.kv_events(after_sequence=batch_a.sequence, epoch=batch_a.epoch)
    assert await asyncio.wait_for(anext(resumed), 30) == batch_b  # replayed, not a snapshot
    await resumed.aclose()


async def test_a_mock_without_a_prefix_cache_refuses_kv_events(mock_worker_factory):
    worker = await mock_worker_factory.start(mock_ttft_ms=5)
    async with WorkerClient(worker.address) as client:
        assert not (await client.info()).kv_events
        with pytest.raises(KvEventsUnsupportedError, match="mock-kv-blocks"):
            await anext(client.kv_events())


async def test_a_cache_salt_reaches_the_engine_and_keeps_its_blocks_apart(client):
    # vLLM's cache_salt: blocks are shared only between requests of the same salt. The worker
    # used to validate the field and then drop it, so salted tenants shared each other's cache.
    prompt = [4 + (i * 7) % 40 for i in range(40)]  # two full blocks, unlike the other tests' prompts
    assert await cached_tokens(client, "salt-a1", prompt, cache_salt="tenant-a") == 0
    assert await cached_tokens(client, "salt-b1", prompt, cache_salt="tenant-b") == 0
    assert await cached_tokens(client, "unsalted", prompt) == 0
    assert await cached_tokens(client, "salt-a2", prompt, cache_salt="tenant-a") == 2 * BS
