"""The engine's KV-cache events as plain values, and their wire form (`KvEventBatch`).

A worker relays vLLM's events (BlockStored / BlockRemoved / AllBlocksCleared) in batches that
carry an `epoch` (new at each engine start) and a `sequence` (one more per batch within that
epoch). A router applies them in order to its cache index (router/cache/index.py); a gap in
the sequence, or a new epoch, means it asks again and gets a snapshot.

Engine block hashes are opaque bytes here (vLLM's int hashes become 8 bytes, big-endian): a
router keys blocks by its own hash of the token ids and keeps the engine's only to apply
removals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.protocol import worker_pb2 as pb


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Blocks in prompt order; block i holds token_ids[i*block_size:(i+1)*block_size]."""
    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str = ""
    medium: str = ""
    # The request's cache salt, on an event whose first block is a prompt's first (no parent):
    # vLLM puts the salt in that block's hash only, and the chain carries it to the rest.
    cache_salt: str = ""


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[bytes, ...]
    medium: str = ""


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    epoch: str
    sequence: int
    ts: float
    events: tuple[KvEvent, ...] = field(default_factory=tuple)
    snapshot: bool = False      # the whole cache now: replace what is held for this worker
    block_size: int = 0


def engine_hash_bytes(value: bytes | int) -> bytes:
    """vLLM's ExternalBlockHash (bytes, or an int in some releases) as bytes."""
    if isinstance(value, bytes):
        return value
    return int(value).to_bytes(8, "big", signed=value < 0)


def event_to_pb(event: KvEvent) -> pb.KvEvent:
    if isinstance(event, BlocksStored):
        return pb.KvEvent(stored=pb.KvBlocksStored(
            block_hashes=list(event.block_hashes), parent_block_hash=event.parent_block_hash or b"",
            token_ids=list(event.token_ids), block_size=event.block_size, lora_name=event.lora_name,
            medium=event.medium, cache_salt=event.cache_salt))
    if isinstance(event, BlocksRemoved):
        return pb.KvEvent(removed=pb.KvBlocksRemoved(block_hashes=list(event.block_hashes), medium=event.medium))
    return pb.KvEvent(cleared=pb.KvAllCleared())


def event_from_pb(message: pb.KvEvent) -> KvEvent | None:
    """None for a kind this release does not know (a newer worker's): skipped, not fatal."""
    kind = message.WhichOneof("kind")
    if kind == "stored":
        s = message.stored
        return BlocksStored(tuple(s.block_hashes), s.parent_block_hash or None, tuple(s.token_ids),
                            s.block_size, s.lora_name, s.medium, s.cache_salt)
    if kind == "removed":
        return BlocksRemoved(tuple(message.removed.block_hashes), message.removed.medium)
    if kind == "cleared":
        return AllCleared()
    return None


def batch_to_pb(batch: KvEventBatch) -> pb.KvEventBatch:
    return pb.KvEventBatch(epoch=batch.epoch, sequence=batch.sequence, ts=batch.ts, snapshot=batch.snapshot,
                           block_size=batch.block_size, events=[event_to_pb(e) for e in batch.events])


def batch_from_pb(message: pb.KvEventBatch) -> KvEventBatch:
    events = tuple(e for e in (event_from_pb(m) for m in message.events) if e is not None)
    return KvEventBatch(message.epoch, message.sequence, message.ts, events, message.snapshot, message.block_size)
