"""Many generate() streams of one client over one GenerateMany call to the worker.

A gRPC message costs tens of microseconds of CPU on each side (Python, the C core, a system
call, a wake-up of the event loop); at ~10,000 tokens/s per worker, one message per token per
request is what capped throughput. Over this call the worker batches every ready chunk into
one message. Each generate() gets a stream number, unique within the call (so a late event of
a finished stream can never reach a new one that reuses its request id); its events go to its
own queue. If the call breaks, every open stream gets the error the per-request call would
have given (a dead worker is WorkerUnavailableError either way), and the next generate()
opens a new call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from vllm_fleet.client.errors import error_from_rpc, error_from_status
from vllm_fleet.errors import FleetError, WorkerTimeoutError, WorkerUnavailableError
from vllm_fleet.protocol import worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.chunk_merge import merge_waiting
from vllm_fleet.protocol.convert import chunk_from_pb, load_from_pb, request_to_pb
from vllm_fleet.protocol.types import Chunk, GenerateRequest, WorkerLoad

logger = logging.getLogger(__name__)

_DEADLINE = object()      # the whole request ran out of time
_CLOSE = object()         # ends the call's request stream
# A batch of requests stays this small: far below any gRPC message limit (a few requests near
# the gateway's body limit would pass 64 MiB together and break the whole call), and large
# requests gain nothing from sharing a write.
BATCH_BYTES = 1024 * 1024


def _chunk(message: pb.GenerateChunk) -> Chunk:
    """chunk_from_pb, with a shortcut for the chunk of almost every step: text and token ids only."""
    if (message.finish_reason or message.logprobs or message.reasoning or message.tool_calls
            or message.prompt_logprobs or message.HasField("prompt_text")):
        return chunk_from_pb(message)
    return Chunk(message.index, message.sample, message.text, list(message.token_ids))


class MuxUnsupported(Exception):
    """The worker has no GenerateMany (it answered UNIMPLEMENTED): use one call per request."""


class MuxNeverAnswered(Exception):
    """The stream call failed with INTERNAL before the worker answered anything. grpcio reports so
    when the client's first write loses the race with a worker that closed the call at once, which
    is how a worker without GenerateMany answers: its UNIMPLEMENTED then never reaches us. Nothing
    of the request was streamed, so it can take its own Generate call, which either serves it or
    reports the worker's real error; the next request tries the stream call again."""


class Multiplexer:
    """`on_load` gets each Load the worker attaches to a response (every few hundred ms)."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub, address: str, *,
                 on_load: Callable[[WorkerLoad], None] | None = None) -> None:
        self.address = address
        self._on_load = on_load
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._streams: dict[int, asyncio.Queue] = {}
        self._numbers = itertools.count(1)
        self._load_every_asked = 0     # ms, asked of the worker on this call
        self.pushes_load = False       # the worker said it pushes Loads on this call (load_every_ms)
        self.failed: BaseException | None = None
        self._call = stub.GenerateMany(self._requests())
        self._reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.MuxRequest]:
        """The call's request stream. grpcio takes the next message only when the last write has
        completed; whatever queued up meanwhile goes as one message (a busy gateway starts many requests per write), up to BATCH_BYTES."""
        held = None  # taken from the queue but past the batch's size: the next message
        while True:
            message, held = held if held is not None else await self._outgoing.get(), None
            if message is _CLOSE:
                return
            size = message.ByteSize()
            while not self._outgoing.empty():
                more = self._outgoing.get_nowait()
                more_size = 0 if more is _CLOSE else more.ByteSize()
                if more is _CLOSE or size + more_size > BATCH_BYTES:
                    held = more
                    break
                message.batched.append(more)
                size += more_size
            yield message

    async def _read(self) -> None:
        error: BaseException
        answered = False
        try:
            async for response in self._call:
                answered = True
                self.pushes_load = response.load_every_ms > 0
                if self._on_load is not None and response.HasField("load"):
                    self._on_load(load_from_pb(response.load))
                for event in response.events:
                    queue = self._streams.get(event.stream)
                    if queue is not None:
                        queue.put_nowait(event)
            error = WorkerUnavailableError(f"worker {self.address} ended the stream call", worker=self.address)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                error = MuxUnsupported(exc.details())
            elif exc.code() == grpc.StatusCode.INTERNAL and not answered:
                error = MuxNeverAnswered(exc.details())
            else:
                error = error_from_rpc(exc, self.address)
        except asyncio.CancelledError:
            error = WorkerUnavailableError(f"client of {self.address} closed", worker=self.address)
        except Exception as exc:  # e.g. a response that does not parse
            logger.warning("stream call to %s failed", self.address, exc_info=True)
            error = WorkerUnavailableError(f"worker {self.address}: stream call failed: {exc}", worker=self.address)
        self.failed = error
        for queue in self._streams.values():
            queue.put_nowait(error)

    def ask_load_every(self, seconds: float) -> None:
        """Ask the worker to push its Load at least every `seconds`, idle or not (once per call)."""
        every_ms = max(1, round(seconds * 1000))
        if every_ms != self._load_every_asked and self.failed is None:
            self._load_every_asked = every_ms
            self._outgoing.put_nowait(pb.MuxRequest(load_every_ms=every_ms))

    @property
    def ended(self) -> asyncio.Task:
        """Done once the call has failed or ended."""
        return self._reader

    async def generate(self, request: GenerateRequest, *, timeout: float | None) -> AsyncIterator[Chunk]:
        if self.failed is not None:
            raise self.failed
        stream = next(self._numbers)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[stream] = queue
        deadline = None if timeout is None else asyncio.get_running_loop().call_later(
            timeout, queue.put_nowait, _DEADLINE)
        self._outgoing.put_nowait(pb.MuxRequest(stream=stream, start=request_to_pb(request)))
        ended = False
        held = None  # taken from the queue behind events that waited: handled after their chunks
        try:
            while True:
                item, held = held if held is not None else await queue.get(), None
                if isinstance(item, pb.MuxEvent):
                    chunks = item.chunks
                    if not item.done and not queue.empty():
                        # The consumer fell behind: what waits goes on as one chunk per stream
                        # (chunk_merge.py), since it could reach the client no sooner anyway.
                        chunks = list(chunks)
                        while not item.done and not queue.empty():
                            more = queue.get_nowait()
                            if not isinstance(more, pb.MuxEvent):
                                held = more
                                break
                            chunks.extend(more.chunks)
                            item = more
                        chunks = merge_waiting(chunks)
                    for message in chunks:
                        yield _chunk(message)
                    if item.done:
                        ended = True
                        if item.status_code:
                            raise error_from_status(item.status_code, item.status_message, self.address,
                                                    param=item.status_param)
                        return
                elif item is _DEADLINE:
                    raise WorkerTimeoutError(f"worker {self.address}: deadline exceeded", worker=self.address)
                else:  # the call failed: every stream on it ends with its error
                    ended = True
                    raise item if isinstance(item, (FleetError, MuxUnsupported, MuxNeverAnswered)) else WorkerUnavailableError(
                        f"worker {self.address}: {item}", worker=self.address)
        finally:
            if deadline is not None:
                deadline.cancel()
            del self._streams[stream]
            if not ended and self.failed is None:
                # Left early (consumer gone, timeout): the worker aborts the engine requests.
                self._outgoing.put_nowait(pb.MuxRequest(stream=stream, cancel=True))

    async def close(self) -> None:
        self._outgoing.put_nowait(_CLOSE)
        self._call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
