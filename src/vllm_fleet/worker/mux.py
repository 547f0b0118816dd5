"""One GenerateMany call on the worker: the streams it runs, the outbox they write to, its messages.

Each request of the call runs in its own task and adds its chunks to the outbox; the call's
writer takes everything that has accumulated and sends it as one `MuxResponse`. Batching needs no
timer: vLLM hands a step's outputs to all its requests within a loop iteration or two, and
while one message is being written the next one fills up, so a busy worker sends about one
message per engine step (a few, when vLLM splits a large step into slices).

The worker's Load rides along, so that routers can skip their Load polls: on a message with
events every MUX_LOAD_INTERVAL_S, and, once the client asks (MuxRequest.load_every_ms), on its
own every so often while the call is idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.chunk_merge import can_fold, fold_chunk
from vllm_fleet.protocol.convert import fill_chunk_pb, load_to_pb
from vllm_fleet.protocol.types import Chunk, WorkerLoad

# How often a GenerateMany call that carries events also carries the worker's Load, unless the
# client asked for pushes (MuxRequest.load_every_ms): twice per router Load interval (0.5 s by
# default), so that each turn of a router that polls finds a fresh one and skips the poll.
MUX_LOAD_INTERVAL_S = 0.25


class MuxOutbox:
    """The events of the next message. A chunk whose stream already has one waiting here is folded
    into it (protocol/chunk_merge.py): both would go in the same message anyway, and the client
    then handles one chunk where it would have handled two. That happens only while a write is in
    flight, i.e. when the call is busy; an idle call sends every engine step as its own chunk."""

    def __init__(self) -> None:
        self._events: dict[int, pb.MuxEvent] = {}
        self._last: dict[tuple[int, int, int], pb.GenerateChunk] = {}  # (stream, index, sample) → its waiting chunk
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
        key = (stream, chunk.index, chunk.sample)
        waiting = self._last.get(key)
        if waiting is not None and can_fold(waiting, chunk):
            fold_chunk(waiting, chunk)
            return
        message = self._event(stream).chunks.add()
        fill_chunk_pb(message, chunk)
        self._last[key] = message

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
        self._last = {}
        return events


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What a MuxCall needs of its event loop; tests drive the timer with a clock of their own."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class MuxCall:
    """One GenerateMany call. The service reads the client's requests and starts and cancels
    streams here (their tasks write to `outbox`); its writer sends what `next_response` gives."""

    def __init__(self, current_load: Callable[[], WorkerLoad], clock: Clock | None = None) -> None:
        self.outbox = MuxOutbox()
        self._current_load = current_load
        self._clock: Clock = clock or asyncio.get_running_loop()
        self._streams: dict[int, asyncio.Task] = {}
        self._load_due = self._clock.time()  # the call's first message carries one
        self._load_every: float | None = None  # seconds between Loads on an idle call, once asked
        self._timer: Cancellable | None = None

    # ------------------------------------------------------------------ the reader's side

    def is_open(self, stream: int) -> bool:
        return stream in self._streams

    def start(self, stream: int, run: Coroutine[Any, Any, None]) -> None:
        task = self._streams[stream] = asyncio.create_task(run)
        task.add_done_callback(lambda _: self._streams.pop(stream, None))

    def cancel(self, stream: int) -> None:
        task = self._streams.get(stream)
        if task is not None:
            task.cancel()

    def push_loads_every(self, seconds: float) -> None:
        """Send Loads while the call is idle too; the first at once: it tells the client they will come."""
        self._load_every = seconds
        self._load_due = self._clock.time()
        self.outbox.wake()

    async def requests_ended(self) -> None:
        """The client half-closed (or went away): the call ends once its streams have."""
        if self._streams:
            await asyncio.gather(*self._streams.values(), return_exceptions=True)
        self.outbox.close()

    # ------------------------------------------------------------------ the writer's side

    async def next_response(self) -> pb.MuxResponse | None:
        """The next message: the events that are ready, a Load that is due, or both; None once
        the call is over."""
        while (events := await self.outbox.take()) is not None:
            load = self._load_if_due()
            if load is not None or events:
                every_ms = round(self._load_every * 1000) if self._load_every else 0
                return pb.MuxResponse(events=events, load=load, load_every_ms=every_ms)
            self._wake_when_load_due()  # the timer ran a hair early: nothing is due yet
        return None

    def _load_if_due(self) -> pb.WorkerLoad | None:
        """The Load to send with this message, if one is due: the router then skips its poll."""
        if self._clock.time() < self._load_due:
            return None
        load = load_to_pb(self._current_load())
        # A client that asked for pushes takes each as it comes: its interval is enough.
        self._load_due = self._clock.time() + (self._load_every or MUX_LOAD_INTERVAL_S)
        if self._load_every is not None:
            self._wake_when_load_due()
        return load

    def _wake_when_load_due(self) -> None:
        # An idle call's writer waits in take(): this wakes it when a Load is due. Armed once
        # per Load sent, not per message (a timeout per take() would cost every message).
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._clock.call_at(self._load_due, self.outbox.wake)

    async def close(self) -> None:
        """The call is over: no more timer, and its streams stop, since no one listens to them."""
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._streams.values()):
            task.cancel()
        await asyncio.gather(*self._streams.values(), return_exceptions=True)
