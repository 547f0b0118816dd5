"""Cache-aware routing end to end: mock workers with a simulated prefix cache stream their KV
events; the router's index follows them and sends each prompt where its prefix is held."""

from __future__ import annotations

import asyncio
import random
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from fakes import send_token_ids
from support import wait_until
from vllm_fleet.gateway.dashboard import Dashboard
from vllm_fleet.protocol.kv_events import BlocksStored, KvEventBatch
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.cache.follower import KvFollower
from vllm_fleet.router.cache.index import CacheIndex

BS = 16
FAST = dict(load_poll_interval_s=0.1, health_poll_interval_s=0.2)


@asynccontextmanager
async def routed(addresses: list[str], policy: str = "cache_aware"):
    registry = StaticRegistry([WorkerRecord(address=a) for a in addresses])
    router = Router(registry, RouterConfig(policy=policy, **FAST), metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await router.wait_ready(timeout=60)
        await wait_until(lambda: len(router.snapshot().eligible()) == len(addresses), timeout=60,
                         message="every worker serving")
        yield router
    finally:
        await router.close()


SHARED_BLOCKS = 24


def prompt(prefix: int, suffix: int) -> list[int]:
    """A prompt of 24 blocks shared by every request of `prefix`, then 8 tokens of its own (the
    mock's vocabulary is 44 tokens: ids 4..43). Long enough that the prefill it saves outweighs
    a worker's Load still counting the request before as running."""
    shared = [4 + (prefix * 7 + i * (prefix + 1)) % 40 for i in range(SHARED_BLOCKS * BS)]
    return shared + [4 + (suffix + i) % 40 for i in range(8)]


send = send_token_ids


async def test_each_prefix_goes_where_it_is_held_and_the_engines_hit(mock_worker_factory):
    workers = [await mock_worker_factory.start(mock_kv_blocks=1024, block_size=BS, mock_ttft_ms=1,
                                               mock_tokens_per_s=500) for _ in range(2)]
    async with routed([w.address for w in workers]) as router:
        await wait_until(lambda: all(w.kv_events_fresh for w in router.snapshot()), timeout=30,
                         message="both workers' events followed")
        homes, hits = {}, 0
        for prefix in range(6):
            homes[prefix], _ = await send(router, f"p{prefix}-0", prompt(prefix, 0))
        # (Where each prefix first goes is its home on the hash ring: policies test the spread.)
        for round_ in range(1, 4):
            for prefix in range(6):
                worker, cached = await send(router, f"p{prefix}-{round_}", prompt(prefix, round_))
                assert worker == homes[prefix], f"prefix {prefix} left the worker that holds it"
                hits += cached
        assert hits == 18 * SHARED_BLOCKS * BS  # every follow-up found every shared block in its engine
        assert not any(router._cache.stats()["copied_tokens"].values())  # and no prefix was prefilled twice
        # Every new prefix came back: a home stays worth all its tokens (router/cache/prefix_reuse.py) ...
        assert list(router._cache.stats()["prefix_reuse"].values()) == [1.0]
        view = router.snapshot().get(homes[0]).to_dict()
        assert view["cache"]["events"] == "in step" and view["cache"]["predicted_hit_rate"] > 0.5
        assert view["cache"]["copied_share"] == 0.0  # what the dashboard shows beside the hits
        # The dashboard's state carries the index's own counters (what an SRE reads for resyncs).
        (index_stats,) = Dashboard(router).own_state()["cache_index"]
        assert index_stats["events_applied"] > 0 and index_stats["resyncs_needed"] == 0
        assert list(index_stats["prefix_reuse"].values()) == [1.0]   # what a home is worth, for an SRE to read
        assert sum(index_stats["entries"].values()) >= 6 * SHARED_BLOCKS
        # ... until new prompts stop coming back (each its own 24 blocks).
        rng = random.Random(7)
        for n in range(30):
            await send(router, f"unique-{n}", [rng.randrange(4, 44) for _ in range(SHARED_BLOCKS * BS)])
        assert list(router._cache.stats()["prefix_reuse"].values())[0] < 0.2


async def test_one_models_unique_prompts_leave_another_models_home_its_worth(mock_worker_factory):
    """What a home is worth is each model's own: beside a model whose prompts share nothing, one
    whose documents come back keeps the full home (router/cache/prefix_reuse.py)."""
    common = dict(mock_kv_blocks=1024, block_size=BS, mock_ttft_ms=1, mock_tokens_per_s=500)
    # Two workers a model: a model's only worker leaves nothing to decide, and nothing is keyed.
    workers = [await mock_worker_factory.start(served_model_name=name, **common) for name in ("docs", "unique") * 2]
    async with routed([w.address for w in workers]) as router:
        await wait_until(lambda: all(w.kv_events_fresh for w in router.snapshot()), timeout=30,
                         message="both workers' events followed")

        rng = random.Random(11)
        for round_ in range(3):
            for prefix in range(4):
                await send(router, f"docs-{prefix}-{round_}", prompt(prefix, round_), model="docs")
                for n in range(3):
                    await send(router, f"unique-{round_}-{prefix}-{n}",
                               [rng.randrange(4, 44) for _ in range(SHARED_BLOCKS * BS)], model="unique")
        reuse = router._cache.stats()["prefix_reuse"]
        assert reuse["docs"] == 1.0
        assert reuse["unique"] < 0.2


async def test_a_restarted_worker_loses_its_entries_within_a_second_of_its_return(mock_worker_factory):
    worker = await mock_worker_factory.start(mock_kv_blocks=1024, block_size=BS, mock_ttft_ms=1)
    async with routed([worker.address]) as router:
        index = router._cache.index
        await wait_until(lambda: router.snapshot().get(worker.address).kv_events_fresh, timeout=30,
                         message="events followed")
        await send(router, "before", prompt(1, 0))
        await wait_until(lambda: index.entries_per_worker().get(worker.address, 0) >= SHARED_BLOCKS, timeout=10,
                         message="its blocks indexed")
        worker.stop(timeout=10)
        worker.start()
        await worker.wait_serving(120)
        returned = asyncio.get_running_loop().time()
        # The new engine's epoch comes with an empty snapshot: the old blocks go with it.
        await wait_until(lambda: index.entries_per_worker().get(worker.address, 0) == 0, timeout=5,
                         interval=0.01, message="old entries dropped")
        assert asyncio.get_running_loop().time() - returned <= 1.0


class ScriptedEvents:
    """A worker client whose KvEvents streams are the test's lists of batches (or an error)."""

    def __init__(self, *streams) -> None:
        self.streams = list(streams)
        self.asked: list[tuple[int, str]] = []
        self.done = asyncio.Event()

    async def kv_events(self, *, after_sequence: int = 0, epoch: str = ""):
        self.asked.append((after_sequence, epoch))
        if not self.streams:
            self.done.set()
            await asyncio.Event().wait()
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        for batch in stream:
            yield batch


def stored(*tokens: int, parent: bytes | None = None, name: bytes = b"h1") -> BlocksStored:
    return BlocksStored((name,), parent, tokens, len(tokens))


async def test_a_gap_in_the_events_asks_for_a_snapshot_and_a_broken_stream_replays():
    from vllm_fleet.errors import WorkerUnavailableError

    snap = KvEventBatch("e1", 1, 0.0, (stored(1, 2, 3, 4),), snapshot=True, block_size=4)
    gap = KvEventBatch("e1", 3, 0.0, (stored(5, 6, 7, 8, parent=b"h1", name=b"h2"),), block_size=4)
    snap2 = KvEventBatch("e1", 3, 0.0, (stored(1, 2, 3, 4), stored(5, 6, 7, 8, parent=b"h1", name=b"h2")),
                         snapshot=True, block_size=4)
    client = ScriptedEvents([snap, gap], [snap2], WorkerUnavailableError("gone", worker="w"))
    index = CacheIndex()
    follower = KvFollower("w", client, index, lambda: "m")
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.wait_for(client.done.wait(), 10)
    finally:
        task.cancel()
    # First from nothing; after the gap from nothing again (a snapshot); after the break, from
    # where it was (a replay), not from nothing.
    assert client.asked == [(0, ""), (0, ""), (3, "e1"), (3, "e1")]
    assert follower.resyncs == 1 and not follower.fresh
    assert index.entries_per_worker() == {"w": 2}  # the snapshot after the gap has both blocks
