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
