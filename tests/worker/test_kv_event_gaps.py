"""vLLM's KV events come numbered; a batch lost between its publisher and our reader (its queue or
ZMQ dropped it) could hold a removal, which would leave the relay's mirror, and every router's
index, claiming blocks the engine no longer has. The reader then clears the mirror before the next
batch: routers under-count until blocks are stored again, never over-count."""

from __future__ import annotations

import asyncio

import msgspec
import zmq

from support import wait_until
from vllm_fleet.protocol.kv_events import AllCleared
from vllm_fleet.worker.engines.vllm_kv_events import KvEventReader
from vllm_fleet.worker.kv_relay import KvRelay


def frames(sequence: int) -> list[bytes]:
    """One batch as vLLM's publisher sends it: topic, sequence number, msgpack [ts, events]."""
    return [b"kv", sequence.to_bytes(8, "big", signed=True), msgspec.msgpack.encode([float(sequence), []])]


async def test_a_lost_batch_clears_the_mirror_before_the_next_one():
    published: list[list] = []
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    reader = KvEventReader(socket, asyncio.get_running_loop(), lambda events, ts: published.append(list(events)))
    try:
        for sequence in (1, 2, 3):
            reader._handle(frames(sequence))  # noqa: SLF001 - the reader thread's step, driven here
        reader._handle(frames(6))            # 4 and 5 never came  # noqa: SLF001
        reader._handle(frames(7))            # noqa: SLF001
        await wait_until(lambda: published, timeout=5, message="the reader's batch on the loop")
        assert published == [[AllCleared()]]
        assert reader.gaps == 2
    finally:
        socket.close(linger=0)
        context.term()


def stored(sequence: int, block: bytes, block_size: int = 4) -> list[bytes]:
    """A batch holding one BlockStored, in vLLM's tagged array form (its msgspec encoding)."""
    event = ["BlockStored", [block], None, list(range(block_size)), block_size, None, "GPU", None]
    return [b"kv", sequence.to_bytes(8, "big", signed=True), msgspec.msgpack.encode([float(sequence), [event]])]


async def test_after_a_gap_the_mirror_holds_only_what_came_after_it():
    # Wired as the engine wires them (vllm_engine.py): the reader publishes into the relay. A
    # block stored before the gap may have been removed in a lost batch: the mirror lets it go,
    # and keeps the block the batch after the gap stored.
    relay = KvRelay(4, 100)
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    reader = KvEventReader(socket, asyncio.get_running_loop(), relay.publish)
    try:
        reader._handle(stored(1, b"before"))  # noqa: SLF001 - the reader thread's step, driven here
        reader._handle(stored(2, b"also-before"))  # noqa: SLF001
        await wait_until(lambda: relay.blocks_held == 2, timeout=5, message="the blocks before the gap")
        reader._handle(stored(5, b"after"))   # 3 and 4 never came  # noqa: SLF001
        await wait_until(lambda: relay.sequence == 3, timeout=5, message="the batch after the gap")
        held = [h for event in relay.snapshot().events for h in event.block_hashes]
        assert held == [b"after"]
        assert reader.gaps == 2
        reader._handle(stored(6, b"next"))    # in sequence: nothing cleared  # noqa: SLF001
        await wait_until(lambda: relay.blocks_held == 2, timeout=5, message="the next batch, kept")
        assert reader.gaps == 2
    finally:
        socket.close(linger=0)
        context.term()
