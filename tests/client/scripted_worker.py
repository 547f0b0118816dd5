"""A gRPC worker whose answers the test writes by hand, served in-process on a real port.

The client under test talks real gRPC to it, so stream bookkeeping is checked against what
goes over the wire, not against mocks of grpc internals. Each GenerateMany call is a
`ScriptedCall`: the test reads what the client sent (`next_request`) and says what the worker
answers (`send`, `fail`, `end`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from vllm_fleet.protocol import PARAM_METADATA_KEY, worker_pb2 as pb, worker_pb2_grpc

WAIT_S = 10.0  # a deadline for every wait, so a broken client fails the test instead of hanging it


def event(stream: int, *texts: str, done: bool = False, code: grpc.StatusCode = grpc.StatusCode.OK,
          message: str = "", param: str = "") -> pb.MuxEvent:
    """A MuxEvent for `stream`: one chunk per text (input 0, sample 0), then maybe the end."""
    chunks = [pb.GenerateChunk(index=0, sample=0, text=text) for text in texts]
    return pb.MuxEvent(stream=stream, chunks=chunks, done=done, status_code=code.value[0],
                       status_message=message, status_param=param)


class ScriptedCall:
    """One GenerateMany call as the worker sees it."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[pb.MuxRequest] = asyncio.Queue()
        self._script: asyncio.Queue = asyncio.Queue()
        self._unpacked: list[pb.MuxRequest] = []  # the rest of the last message, one start or cancel each

    async def next_request(self) -> pb.MuxRequest:
        """The next message as it came over the wire (its `batched` starts and cancels in it)."""
        return await asyncio.wait_for(self.received.get(), WAIT_S)

    async def next_item(self) -> pb.MuxRequest:
        """The next start or cancel, in the order a worker handles them: a message, then its batched."""
        if not self._unpacked:
            message = await self.next_request()
            self._unpacked = [message, *message.batched]
        return self._unpacked.pop(0)

    async def next_start(self) -> pb.MuxRequest:
        item = await self.next_item()
        assert item.WhichOneof("kind") == "start", f"expected a start, got {item}"
        return item

    def send(self, *events: pb.MuxEvent) -> None:
        """One MuxResponse carrying `events`, in order."""
        self._script.put_nowait(pb.MuxResponse(events=events))

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """End the whole call with `code`, as a worker that breaks would."""
        self._script.put_nowait((code, details))

    def end(self) -> None:
        """End the call normally (status OK), whatever streams are still open."""
        self._script.put_nowait(None)

    async def serve(self, requests: AsyncIterator[pb.MuxRequest],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.MuxResponse]:
        async def read() -> None:
            async for message in requests:
                self.received.put_nowait(message)

        reader = asyncio.create_task(read())
        try:
            while (item := await self._script.get()) is not None:
                if isinstance(item, tuple):
                    await context.abort(*item)
                yield item
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


class ScriptedWorker(worker_pb2_grpc.WorkerServicer):
    """GenerateMany calls go to the test as ScriptedCalls; Generate refuses the ids in `refusals`
    (request id → (code, details, param or None)) and answers any other with one chunk "ok"."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[ScriptedCall] = asyncio.Queue()
        self.refusals: dict[str, tuple[grpc.StatusCode, str, str | None]] = {}
        self.address = ""

    async def next_call(self) -> ScriptedCall:
        return await asyncio.wait_for(self.calls.get(), WAIT_S)

    async def GenerateMany(self, requests, context):
        call = ScriptedCall()
        self.calls.put_nowait(call)
        async for response in call.serve(requests, context):
            yield response

    async def Generate(self, request, context):
        refusal = self.refusals.get(request.request_id)
        if refusal is not None:
            code, details, param = refusal
            trailing = ((PARAM_METADATA_KEY, param),) if param is not None else ()
            await context.abort(code, details, trailing)
        yield pb.GenerateChunk(index=0, sample=0, text="ok", finish_reason="stop")
