"""KvRelay: sequence numbers, replay, snapshots, slow subscribers, and the mirror of held blocks."""

from __future__ import annotations

import asyncio

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored
from vllm_fleet.worker.kv_relay import KvRelay

BS = 4


def stored(hashes: list[bytes], parent: bytes | None = None, first_token: int = 0) -> BlocksStored:
    tokens = tuple(range(first_token, first_token + BS * len(hashes)))
    return BlocksStored(tuple(hashes), parent, tokens, BS)


def held(batch) -> list[bytes]:
    return [h for event in batch.events for h in event.block_hashes]


async def take(stream, count: int, timeout: float = 5.0):
    return [await asyncio.wait_for(anext(stream), timeout) for _ in range(count)]


def test_each_batch_gets_the_next_sequence_in_one_epoch():
    relay = KvRelay(BS, 100)
    first = relay.publish([stored([b"a"])])
    second = relay.publish([stored([b"b"], b"a")])
    assert relay.publish([]) is None  # an empty batch uses no number
    assert (first.sequence, second.sequence, relay.sequence) == (1, 2, 2)
    assert first.epoch == second.epoch == relay.epoch != KvRelay(BS, 100).epoch
    assert second.block_size == BS and not second.snapshot


async def test_a_subscriber_of_this_epoch_gets_the_batches_after_its_sequence():
    relay = KvRelay(BS, 100)
    batches = [relay.publish([stored([bytes([i])])]) for i in range(5)]
    stream = relay.subscribe(after_sequence=2, epoch=relay.epoch)
    assert await take(stream, 3) == batches[2:]
    live = relay.publish([stored([b"z"])])
    assert await take(stream, 1) == [live]
    await stream.aclose()


async def test_a_current_subscriber_gets_only_live_batches():
    relay = KvRelay(BS, 100)
    relay.publish([stored([b"a"])])
    stream = relay.subscribe(after_sequence=1, epoch=relay.epoch)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    live = relay.publish([stored([b"b"], b"a")])
    assert await asyncio.wait_for(pending, 5) == live
    await stream.aclose()


async def test_new_other_epoch_and_too_far_behind_subscribers_get_a_snapshot_then_live_batches():
    relay = KvRelay(BS, 100, ring_batches=3)
    relay.publish([stored([b"a", b"b"])])
    for i in range(4):
        relay.publish([stored([bytes([i])], b"b")])
    for after, epoch in ((0, ""), (5, "another-epoch"), (1, relay.epoch), (99, relay.epoch)):
        now = relay.sequence
        stream = relay.subscribe(after_sequence=after, epoch=epoch)
        (snapshot,) = await take(stream, 1)
        assert snapshot.snapshot and snapshot.sequence == now and snapshot.epoch == relay.epoch
        assert held(snapshot)[:2] == [b"a", b"b"] and len(held(snapshot)) == 6
        assert snapshot.events[0].token_ids[:2 * BS] == tuple(range(2 * BS))  # a chain is one event
        live = relay.publish([BlocksRemoved((b"a",))])
        assert await take(stream, 1) == [live]
        await stream.aclose()
        relay.publish([stored([b"a"])])


def test_the_mirror_follows_removals_and_clears_and_orders_parents_first():
    relay = KvRelay(BS, 100)
    relay.publish([stored([b"c"], b"p", first_token=8)])   # a child whose parent comes later
    relay.publish([stored([b"p"], b"root")])              # root itself is not held
    relay.publish([stored([b"x", b"y"])])
    relay.publish([BlocksRemoved((b"x",))])
    snapshot = relay.snapshot()
    order = held(snapshot)
    assert set(order) == {b"p", b"c", b"y"} and order.index(b"p") < order.index(b"c")
    by_first = {e.block_hashes[0]: e for e in snapshot.events}
    assert by_first[b"y"].parent_block_hash == b"x"  # its parent went: it is the head of its own event
    assert by_first[b"p"].block_hashes == (b"p", b"c") and by_first[b"p"].token_ids[BS:] == tuple(range(8, 12))
    relay.publish([AllCleared()])
    assert relay.snapshot().events == () and relay.blocks_held == 0


def test_a_snapshot_and_the_wire_keep_a_prompts_cache_salt():
    from vllm_fleet.protocol.kv_events import batch_from_pb, batch_to_pb

    relay = KvRelay(BS, 100)
    relay.publish([BlocksStored((b"s1", b"s2"), None, tuple(range(2 * BS)), BS, cache_salt="tenant-a")])
    snapshot = relay.snapshot()
    assert [e.cache_salt for e in snapshot.events] == ["tenant-a"]
    assert [e.cache_salt for e in batch_from_pb(batch_to_pb(snapshot)).events] == ["tenant-a"]


def test_the_mirror_never_exceeds_the_engine_block_count():
    relay = KvRelay(BS, 3)
    relay.publish([stored([bytes([i]) for i in range(5)])])
    assert relay.blocks_held == 3 and relay.mirror_overflows == 2


async def test_a_slow_subscriber_is_resynced_with_a_snapshot_and_its_queue_stays_bounded():
    relay = KvRelay(BS, 100, queue_batches=2)
    stream = relay.subscribe()
    assert (await take(stream, 1))[0].snapshot  # new: the (empty) snapshot
    for i in range(10):  # the subscriber reads nothing meanwhile
        relay.publish([stored([bytes([i])])])
        assert all(len(s.batches) <= 2 for s in relay._subscribers)
    assert relay.resyncs == 1
    (resync,) = await take(stream, 1)
    assert resync.snapshot and resync.sequence == 10 and len(held(resync)) == 10
    live = relay.publish([BlocksRemoved((b"\x00",))])
    assert await take(stream, 1) == [live]
    await stream.aclose()
    assert not relay._subscribers


async def test_close_ends_every_subscription():
    relay = KvRelay(BS, 100)
    stream = relay.subscribe()
    await take(stream, 1)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    relay.close()
    try:
        await asyncio.wait_for(pending, 5)
        raise AssertionError("the subscription did not end")
    except StopAsyncIteration:
        pass
