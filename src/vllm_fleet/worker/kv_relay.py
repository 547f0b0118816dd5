"""The worker's relay of its engine's KV-cache events to subscribers (the KvEvents RPC).

It owns three things:
- the numbering: each published batch gets the next `sequence` within an `epoch` (a random id,
  new for every relay, so for every engine start);
- a ring of recent batches, replayed to a subscriber that names a sequence of this epoch the ring
  still covers (a router that reconnected after a short break);
- a mirror of the blocks the engine holds now (engine hash -> parent, token ids, LoRA, medium),
  sent as one snapshot batch to a subscriber that is new, from another epoch, or too far behind.

Loop-bound, not thread-safe: `publish` and `subscribe` run on the worker's event loop. An engine
that reads events on another thread hands them over with `loop.call_soon_threadsafe(relay.publish,
events, ts)`. Publishing never waits on a subscriber: one whose queue is full is dropped to a
fresh snapshot when it reads next (never blocks the engine, never grows without bound).

Bounds: the ring holds `ring_batches` batches, each subscriber queue `queue_batches`, and the
mirror at most `max_blocks` blocks, the engine's block count (the engine cannot hold more; should
events ever say otherwise, the oldest mirrored block goes and `mirror_overflows` counts it). Token
ids are kept as 4-byte ints: ~4 * block_size bytes per block plus ~150 bytes of bookkeeping.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored, KvEvent, KvEventBatch

logger = logging.getLogger(__name__)

DEFAULT_RING_BATCHES = 1024
DEFAULT_QUEUE_BATCHES = 256


@dataclass(slots=True)
class _Block:
    parent: bytes | None
    token_ids: array
    lora_name: str
    medium: str
    cache_salt: str = ""  # a prompt's first block's (no parent)


class _Subscriber:
    """One subscriber's queue of live batches; `resync` when it fell behind the bound."""

    __slots__ = ("batches", "resync", "wake")

    def __init__(self) -> None:
        self.batches: collections.deque[KvEventBatch] = collections.deque()
        self.resync = False
        self.wake = asyncio.Event()


class KvRelay:
    def __init__(self, block_size: int, max_blocks: int, *, ring_batches: int = DEFAULT_RING_BATCHES,
                 queue_batches: int = DEFAULT_QUEUE_BATCHES, clock: Callable[[], float] = time.time) -> None:
        if block_size < 1 or max_blocks < 1 or ring_batches < 1 or queue_batches < 1:
            raise ValueError("block_size, max_blocks, ring_batches and queue_batches must be positive")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.epoch = uuid.uuid4().hex
        self.sequence = 0          # of the last published batch; 0 before the first
        self.resyncs = 0           # subscribers dropped to a snapshot for falling behind
        self.mirror_overflows = 0  # blocks evicted from the mirror because events exceeded max_blocks
        self._queue_batches = queue_batches
        self._clock = clock
        self._ring: collections.deque[KvEventBatch] = collections.deque(maxlen=ring_batches)
        self._blocks: dict[bytes, _Block] = {}  # insertion order: older first
        self._subscribers: set[_Subscriber] = set()
        self._closed = False

    @property
    def blocks_held(self) -> int:
        return len(self._blocks)

    def publish(self, events: Sequence[KvEvent], ts: float | None = None) -> KvEventBatch | None:
        """Number `events` as the next batch, apply them to the mirror, queue them for every
        subscriber. None (and no sequence used) for an empty list."""
        if not events or self._closed:
            return None
        self.sequence += 1
        batch = KvEventBatch(self.epoch, self.sequence, self._clock() if ts is None else ts, tuple(events),
                             block_size=self.block_size)
        for event in batch.events:
            self._apply(event)
        self._ring.append(batch)
        for subscriber in self._subscribers:
            if subscriber.resync:
                continue  # its snapshot, taken when it reads, will include this batch
            if len(subscriber.batches) >= self._queue_batches:
                subscriber.batches.clear()
                subscriber.resync = True
                self.resyncs += 1
            else:
                subscriber.batches.append(batch)
            subscriber.wake.set()
        return batch

    def snapshot(self) -> KvEventBatch:
        """The blocks held now as BlocksStored events, parents before children, at the current sequence."""
        return KvEventBatch(self.epoch, self.sequence, self._clock(), tuple(self._stored_chains()), snapshot=True,
                            block_size=self.block_size)

    def catch_up(self, after_sequence: int, epoch: str) -> list[KvEventBatch]:
        """What a subscriber that has seen `after_sequence` of `epoch` needs to be current: the
        ring's later batches when it covers them, else a snapshot."""
        if epoch == self.epoch and 0 <= after_sequence <= self.sequence:
            if after_sequence == self.sequence:
                return []
            if self._ring and self._ring[0].sequence <= after_sequence + 1:
                return [b for b in self._ring if b.sequence > after_sequence]
        return [self.snapshot()]

    async def subscribe(self, after_sequence: int = 0, epoch: str = "") -> AsyncIterator[KvEventBatch]:
        """Catch-up batches (catch_up), then each live batch in order, until close() or the
        consumer stops. A consumer that falls `queue_batches` behind gets a fresh snapshot."""
        subscriber = _Subscriber()
        self._subscribers.add(subscriber)  # before catch_up, with no await between: nothing is missed
        try:
            for batch in self.catch_up(after_sequence, epoch):
                yield batch
            while not self._closed:
                if subscriber.resync:
                    subscriber.resync = False
                    yield self.snapshot()
                elif subscriber.batches:
                    yield subscriber.batches.popleft()
                else:
                    subscriber.wake.clear()
                    await subscriber.wake.wait()
        finally:
            self._subscribers.discard(subscriber)

    def close(self) -> None:
        """End every subscription (the engine stopped)."""
        self._closed = True
        for subscriber in self._subscribers:
            subscriber.wake.set()

    # ------------------------------------------------------------------------------- the mirror

    def _apply(self, event: KvEvent) -> None:
        if isinstance(event, BlocksStored):
            parent = event.parent_block_hash
            size = event.block_size or self.block_size
            for i, block_hash in enumerate(event.block_hashes):
                tokens = array("i", event.token_ids[i * size:(i + 1) * size])
                held = self._blocks.get(block_hash)
                if held is None:
                    while len(self._blocks) >= self.max_blocks:
                        del self._blocks[next(iter(self._blocks))]
                        self.mirror_overflows += 1
                    salt = event.cache_salt if parent is None else ""
                    self._blocks[block_hash] = _Block(parent, tokens, event.lora_name, event.medium, salt)
                parent = block_hash
        elif isinstance(event, BlocksRemoved):
            for block_hash in event.block_hashes:
                self._blocks.pop(block_hash, None)
        elif isinstance(event, AllCleared):
            self._blocks.clear()

    def _stored_chains(self) -> list[BlocksStored]:
        """The mirror as BlocksStored events: every block after its parent (when the parent is
        held), consecutive blocks of one chain in one event."""
        ordered: list[bytes] = []
        placed: set[bytes] = set()
        for block_hash in self._blocks:
            path = []
            cursor: bytes | None = block_hash
            while cursor is not None and cursor not in placed and cursor in self._blocks:
                path.append(cursor)
                placed.add(cursor)
                cursor = self._blocks[cursor].parent
            ordered.extend(reversed(path))
        events: list[BlocksStored] = []
        run: list[bytes] = []
        for block_hash in ordered:
            block = self._blocks[block_hash]
            if run:
                last = self._blocks[run[-1]]
                if block.parent == run[-1] and (block.lora_name, block.medium) == (last.lora_name, last.medium):
                    run.append(block_hash)
                    continue
                events.append(self._stored(run))
            run = [block_hash]
        if run:
            events.append(self._stored(run))
        return events

    def _stored(self, run: list[bytes]) -> BlocksStored:
        first = self._blocks[run[0]]
        tokens: list[int] = []
        for block_hash in run:
            tokens.extend(self._blocks[block_hash].token_ids)
        return BlocksStored(tuple(run), first.parent, tuple(tokens), self.block_size, first.lora_name, first.medium,
                            first.cache_salt)
