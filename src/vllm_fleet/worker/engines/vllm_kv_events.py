"""vLLM's KV-cache events into the worker's KvRelay.

vLLM's engine core publishes its block pool's events over ZMQ (KVEventsConfig, publisher "zmq"):
multipart messages [topic, 8-byte sequence, msgpack EventBatch], the batch `[ts, [events],
(data_parallel_rank)]`, each event a msgspec struct tagged with its class name (BlockStored,
BlockRemoved, AllBlocksCleared). We listen on localhost only: our SUB socket binds
127.0.0.1 on a free port and the publisher connects to it (vLLM connects to any endpoint
without "*"), so no port can be taken between choosing and binding it.

A reader thread decodes (off the event loop: a batch can hold thousands of token ids) and hands
plain events to the relay with `loop.call_soon_threadsafe`. Decoding uses vLLM's own classes
when they import and accept the message; otherwise the message is read untyped, each event as a
map or as an array in vLLM's field order, so a release whose classes moved or grew fields still
relays. An event that reads as neither is skipped and counted (`malformed`).

Only the GPU-resident cache (medium "GPU", or none) is relayed: a router asks "which engine can
skip this prefill", and blocks offloaded to CPU or storage (KV connectors publish them with their
own medium) are slower to reuse and are evicted on their own schedule; mixing them in would also
let an offload tier's BlockRemoved delete a block the GPU still holds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored, KvEvent, engine_hash_bytes

logger = logging.getLogger(__name__)

RELAYED_MEDIA = (None, "", "GPU")
_POLL_MS = 200  # how often the reader looks at its stop flag
# vLLM's field order of each event in its array form (omitted trailing defaults read as None).
_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def binds_by_convention(endpoint: str) -> bool:
    """vLLM's rule since its publisher learnt to connect (0.26 inline, 0.32 as
    `ZmqEventPublisher._is_bind_endpoint`): bind wildcard, IPv6-any and ipc/inproc endpoints,
    connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def publisher_binds(endpoint: str) -> bool:
    """Whether the installed vLLM's publisher binds `endpoint` (else it connects to it).

    The release's own rule where it has one; otherwise the convention it follows inline. Guessing
    "binds" there was wrong for vLLM 0.26: both sides connected, no event ever arrived, and the
    routers' indexes held only their own speculative entries on every H200 run until 2026-12-04."""
    try:
        from vllm.distributed.kv_events import ZmqEventPublisher
    except ImportError:
        return binds_by_convention(endpoint)
    rule = getattr(ZmqEventPublisher, "_is_bind_endpoint", None)
    return binds_by_convention(endpoint) if rule is None else bool(rule(endpoint))


def open_subscriber(context: zmq.Context) -> tuple[zmq.Socket, str]:
    """A SUB socket for every topic, and the endpoint to give vLLM (localhost only)."""
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.LINGER, 0)
    if not publisher_binds("tcp://127.0.0.1:1"):
        socket.bind("tcp://127.0.0.1:0")
        return socket, socket.getsockopt_string(zmq.LAST_ENDPOINT)
    from vllm_fleet.processes import free_port

    endpoint = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    socket.connect(endpoint)  # a publisher that binds: ZMQ keeps retrying until it is there
    return socket, endpoint


class EventDecoder:
    """vLLM's msgpack batches → (ts, plain events); counts what it cannot read or does not relay."""

    def __init__(self) -> None:
        self.malformed = 0
        self.other_media = 0
        self._raw = msgspec.msgpack.Decoder()
        try:
            from vllm.distributed.kv_events import KVEventBatch

            self._typed: msgspec.msgpack.Decoder | None = msgspec.msgpack.Decoder(KVEventBatch)
        except Exception:  # another release: read untyped
            self._typed = None

    def decode(self, payload: bytes) -> tuple[float | None, list[KvEvent]]:
        batch: Any = None
        if self._typed is not None:
            try:
                batch = self._typed.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                batch = None
        if batch is not None:
            return batch.ts, self._plain_all(
                (type(e).__name__, lambda name, e=e: getattr(e, name, None)) for e in batch.events)
        try:
            raw = self._raw.decode(payload)
            ts, events = raw[0], raw[1]
            ts = float(ts)
            if not isinstance(events, list):
                raise TypeError("events is not a list")
        except (msgspec.DecodeError, IndexError, KeyError, TypeError, ValueError):
            self.malformed += 1
            return None, []
        return ts, self._plain_all(_untyped(e) for e in events)

    def _plain_all(self, events) -> list[KvEvent]:
        plain = []
        for kind, get in events:
            try:
                event = _plain(kind, get)
            except (TypeError, ValueError, OverflowError):
                event = None
            if event is None:
                self.malformed += 1
            elif event is _OTHER_MEDIUM:
                self.other_media += 1
            else:
                plain.append(event)
        return plain


_OTHER_MEDIUM: Any = object()


def _untyped(event: Any) -> tuple[str, Callable[[str], Any]]:
    """A raw event (a map with "type", or an array led by the tag) as its kind and a field reader."""
    if isinstance(event, dict):
        return str(event.get("type", "")), event.get
    if isinstance(event, list) and event and isinstance(event[0], str):
        values = dict(zip(_FIELDS.get(event[0], ()), event[1:]))
        return event[0], values.get
    return "", lambda name: None


def _plain(kind: str, get: Callable[[str], Any]) -> KvEvent | None:
    """One event as ours; None when malformed, _OTHER_MEDIUM when not the GPU cache's."""
    if kind == "AllBlocksCleared":
        return AllCleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        return None
    medium = get("medium")
    if medium not in RELAYED_MEDIA:
        return _OTHER_MEDIUM
    hashes = tuple(engine_hash_bytes(h) for h in get("block_hashes") or ())
    if not hashes:
        return None
    if kind == "BlockRemoved":
        return BlocksRemoved(hashes, medium or "")
    block_size = int(get("block_size") or 0)
    token_ids = tuple(int(t) for t in get("token_ids") or ())
    if block_size < 1 or len(token_ids) != len(hashes) * block_size:
        return None
    parent = get("parent_block_hash")
    lora_name = get("lora_name") or ""
    salt = first_block_salt(get("extra_keys"), lora_name) if parent is None else ""
    return BlocksStored(hashes, None if parent is None else engine_hash_bytes(parent), token_ids, block_size,
                        lora_name, medium or "", salt)


def first_block_salt(extra_keys: Any, lora_name: str) -> str:
    """The cache salt in a prompt's first block's extra keys, "" when none.

    vLLM publishes each block's hash extras untagged, in the order it hashes them: the LoRA name
    (when the request has one), multimodal (identifier, offset) pairs, the cache salt (first
    block only), prompt-embedding digests (bytes). So the salt is the one string left after the
    LoRA name. A router that ignored it would key a salted prompt's blocks as unsalted ones and
    send another tenant's identical prompt to blocks it cannot use."""
    if not isinstance(extra_keys, (list, tuple)) or not extra_keys:
        return ""
    first = extra_keys[0]
    if not isinstance(first, (list, tuple)):
        return ""
    strings = [key for key in first if isinstance(key, str)]
    if lora_name and strings and strings[0] == lora_name:
        strings = strings[1:]
    return strings[0] if strings else ""


class KvEventReader:
    """The thread that reads vLLM's events from `socket` and publishes them to `publish` on `loop`."""

    def __init__(self, socket: zmq.Socket, loop: asyncio.AbstractEventLoop,
                 publish: Callable[[Sequence[KvEvent], float | None], Any]) -> None:
        self.decoder = EventDecoder()
        self.gaps = 0  # sequence numbers vLLM sent that never arrived (its queue or ZMQ dropped them)
        self._socket = socket
        self._loop = loop
        self._publish = publish
        self._stop = threading.Event()
        self._last_sequence: int | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        logger.info("KV-cache event reader stopped: %d malformed event(s), %d of other media, %d lost batch(es)",
                    self.decoder.malformed, self.decoder.other_media, self.gaps)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._socket.poll(_POLL_MS):
                    self._handle(self._socket.recv_multipart())
        except Exception:
            logger.exception("the KV-cache event reader failed; the relay gets no more events")
        finally:
            self._socket.close(linger=0)

    def _handle(self, frames: list[bytes]) -> None:
        events: list[KvEvent] = []
        if len(frames) >= 3 and len(frames[-2]) == 8:
            sequence = int.from_bytes(frames[-2], "big", signed=True)
            if self._last_sequence is not None and sequence > self._last_sequence + 1:
                # Lost events leave the relay's mirror wrong (a lost removal never goes): start it
                # afresh; the router under-counts until blocks are stored again, never over-counts.
                self.gaps += sequence - self._last_sequence - 1
                logger.warning("lost %d KV-cache event batch(es) from vLLM; clearing the relay's mirror",
                               sequence - self._last_sequence - 1)
                events.append(AllCleared())
            self._last_sequence = sequence
        ts, decoded = self.decoder.decode(frames[-1])
        events.extend(decoded)
        if events:
            self._loop.call_soon_threadsafe(self._publish, events, ts)
