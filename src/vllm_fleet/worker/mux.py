"""The outgoing side of one GenerateMany call: chunks of many requests, batched per message.

Each request of the call runs in its own task and adds its chunks here; the call's writer
takes everything that has accumulated and sends it as one `MuxResponse`. Batching needs no
timer: vLLM hands a step's outputs to all its requests within a loop iteration or two, and
while one message is being written the next one fills up, so a busy worker sends about one
message per engine step (a few, when vLLM splits a large step into slices).
"""

from __future__ import annotations

import asyncio

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.convert import fill_chunk_pb
from vllm_fleet.protocol.types import Chunk


class MuxOutbox:
    def __init__(self) -> None:
        self._events: dict[int, pb.MuxEvent] = {}
        self._ready = asyncio.Event()
        self._closed = False
        self._woken = False

    def _event(self, stream: int) -> pb.MuxEvent:
        event = self._events.get(stream)
        if event is None:
            event = self._events[stream] = pb.MuxEvent(stream=stream)
            self._ready.set()
        return event

    def add_chunk(self, stream: int, chunk: Chunk) -> None:
        fill_chunk_pb(self._event(stream).chunks.add(), chunk)

    def end(self, stream: int, code: int = 0, message: str = "", param: str = "") -> None:
        """The request's last event: status 0 when it finished, else a grpc.StatusCode value;
        `param` names the offending field of a refused request."""
        event = self._event(stream)
        event.done = True
        event.status_code = code
        event.status_message = message
        event.status_param = param

    def close(self) -> None:
        """No more events will come: `take` returns what is left, then None."""
        self._closed = True
        self._ready.set()

    def wake(self) -> None:
        """Make `take` return now (or at its next call), with or without events."""
        self._woken = True
        self._ready.set()

    async def take(self) -> list[pb.MuxEvent] | None:
        """Wait for events and return all of them; None once closed and empty; an empty list
        when woken (`wake`) with nothing to send."""
        if not self._events and not self._closed and not self._woken:
            self._ready.clear()
            await self._ready.wait()
        self._woken = False
        if not self._events:
            return None if self._closed else []
        events = list(self._events.values())
        self._events = {}
        return events
