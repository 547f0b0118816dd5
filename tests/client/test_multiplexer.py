"""The multiplexer's stream bookkeeping (client/mux.py), against a scripted worker over real gRPC.

Each generate() must get its own stream number on the call, see only its own events, tell the
worker when it leaves early, and end with the mapped error when the call breaks; the client
then opens a new call for the next request.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from scripted_worker import WAIT_S, ScriptedCall, event

from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.client.mux import BATCH_BYTES, Multiplexer
from vllm_fleet.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
    WorkerUnavailableError,
)
from vllm_fleet.protocol import GenerateInput, GenerateRequest, build_request, worker_pb2_grpc


def _request(request_id: str) -> GenerateRequest:
    return build_request(request_id, [GenerateInput(text="hi")])


async def _texts(chunks) -> list[str]:
    return [chunk.text async for chunk in chunks]


def _run(mux: Multiplexer, request_id: str, *, timeout: float | None = None) -> asyncio.Task:
    """Consume one generate() in the background; the task's result is the texts it received."""
    return asyncio.ensure_future(_texts(mux.generate(_request(request_id), timeout=timeout)))


async def _result(task: asyncio.Task):
    return await asyncio.wait_for(task, WAIT_S)


@pytest.fixture
async def mux(scripted):
    async with grpc.aio.insecure_channel(scripted.address) as channel:
        multiplexer = Multiplexer(worker_pb2_grpc.WorkerStub(channel), scripted.address)
        try:
            yield multiplexer
        finally:
            await multiplexer.close()


async def test_each_stream_gets_its_own_number_and_only_its_own_events(scripted, mux):
    tasks = [_run(mux, f"r{i}") for i in range(3)]
    call = await scripted.next_call()
    starts = [await call.next_start() for _ in tasks]
    numbers = {s.start.request_id: s.stream for s in starts}
    assert len(set(numbers.values())) == 3, f"stream numbers repeat within one call: {numbers}"
    # Answered out of order, in one message: each event still reaches the stream it names.
    call.send(*(event(numbers[f"r{i}"], f"text-{i}", done=True) for i in reversed(range(3))))
    assert [await _result(t) for t in tasks] == [["text-0"], ["text-1"], ["text-2"]]


async def _burst_of_starts(scripted, mux, *, count: int = 20, prompt: str = "hi"):
    """After one answered request, `count` requests at once:
    the messages the worker received for them, and their starts in the order they arrived."""
    first = _run(mux, "first")
    call = await scripted.next_call()
    start = await call.next_start()
    call.send(event(start.stream, "a", done=True))
    assert await _result(first) == ["a"]
    tasks = [asyncio.ensure_future(_texts(mux.generate(build_request(f"b{i}", [GenerateInput(text=prompt)]),
                                                        timeout=None))) for i in range(count)]
    messages, starts = [], []
    while len(starts) < count:
        message = await call.next_request()
        messages.append(message)
        starts += [message, *message.batched]
    call.send(*(event(s.stream, s.start.request_id, done=True) for s in starts))
    assert [await _result(t) for t in tasks] == [[f"b{i}"] for i in range(count)]
    return messages, starts


async def test_a_burst_of_starts_travels_batched(scripted, mux):
    messages, starts = await _burst_of_starts(scripted, mux)
    assert [s.start.request_id for s in starts] == [f"b{i}" for i in range(20)], "batched out of order"
    assert len(messages) < 20, "every start went in a message of its own"


async def test_a_batch_stays_under_its_size_bound_so_large_requests_never_break_the_call(scripted, mux):
    # Five requests of ~400 KB: together they would make one 2 MB message; each batch stays under
    # BATCH_BYTES, and the request that did not fit goes first in the next message.
    messages, starts = await _burst_of_starts(scripted, mux, count=5, prompt="w" * 400_000)
    assert [s.start.request_id for s in starts] == [f"b{i}" for i in range(5)], "batched out of order"
    assert len(messages) > 1, "five large requests went in one message"
    assert all(m.ByteSize() <= BATCH_BYTES for m in messages), [m.ByteSize() for m in messages]


async def test_a_late_event_of_a_finished_stream_never_reaches_a_new_request_with_its_id(scripted, mux):
    first = _run(mux, "same-id")
    call = await scripted.next_call()
    start_a = await call.next_start()
    call.send(event(start_a.stream, "a", done=True))
    assert await _result(first) == ["a"]

    second = _run(mux, "same-id")  # e.g. a retry that reuses the request id
    start_b = await call.next_start()  # a stream that ended normally sends no cancel
    assert start_b.stream != start_a.stream, "a stream number was reused within the call"
    call.send(event(start_a.stream, "late, for the first"), event(start_b.stream, "b", done=True))
    assert await _result(second) == ["b"]


async def test_leaving_a_stream_early_cancels_it_on_the_worker_and_frees_its_number(scripted, mux):
    chunks = mux.generate(_request("leaves"), timeout=None)
    head = asyncio.ensure_future(chunks.__anext__())
    call = await scripted.next_call()
    start = await call.next_start()
    call.send(event(start.stream, "first"))
    assert (await _result(head)).text == "first"
    await chunks.aclose()

    cancel = await call.next_item()
    assert (cancel.stream, cancel.WhichOneof("kind")) == (start.stream, "cancel")
    # Chunks the worker sent before it saw the cancel are dropped; the call keeps serving.
    after = _run(mux, "after")
    start_after = await call.next_start()
    call.send(event(start.stream, "in flight when cancelled"), event(start_after.stream, "next", done=True))
    assert await _result(after) == ["next"]


async def test_a_stream_past_its_deadline_ends_and_is_cancelled_on_the_worker(scripted, mux):
    task = _run(mux, "silent", timeout=0.2)
    call = await scripted.next_call()
    start = await call.next_start()
    with pytest.raises(WorkerTimeoutError, match="deadline exceeded"):
        await _result(task)
    cancel = await call.next_item()
    assert (cancel.stream, cancel.WhichOneof("kind")) == (start.stream, "cancel")


async def test_a_stream_that_ends_in_error_ends_alone_with_its_field_named(scripted, mux):
    bad, duplicate, good = _run(mux, "bad"), _run(mux, "dup"), _run(mux, "good")
    call = await scripted.next_call()
    streams = {s.start.request_id: s.stream for s in [await call.next_start() for _ in range(3)]}
    call.send(
        event(streams["good"], "g1"),
        event(streams["bad"], done=True, code=grpc.StatusCode.INVALID_ARGUMENT,
              message="max_tokens must be at least 1", param="max_tokens"),
        event(streams["dup"], done=True, code=grpc.StatusCode.ALREADY_EXISTS,
              message="request dup is already running on this worker"),
    )
    with pytest.raises(InvalidRequestError) as refused:
        await _result(bad)
    assert refused.value.param == "max_tokens"
    with pytest.raises(DuplicateRequestError):
        await _result(duplicate)
    call.send(event(streams["good"], "g2", done=True))
    assert await _result(good) == ["g1", "g2"]


@pytest.mark.parametrize(("code", "error"), [
    (grpc.StatusCode.UNAVAILABLE, WorkerUnavailableError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, WorkerOverloadedError),
    (grpc.StatusCode.INTERNAL, WorkerError),
])
async def test_a_broken_call_fails_every_open_stream_with_the_mapped_error(scripted, mux, code, error):
    tasks = [_run(mux, "one"), _run(mux, "two")]
    call = await scripted.next_call()
    one = await call.next_start()
    await call.next_start()
    call.send(event(one.stream, "partial"))
    call.fail(code, "the worker broke")
    for task in tasks:
        with pytest.raises(error) as failed:
            await _result(task)
        assert failed.value.worker == scripted.address
        assert failed.value.recoverable
    # This call is done for: a new request on it fails at once instead of waiting forever.
    with pytest.raises(error):
        await _result(_run(mux, "three"))


async def test_a_call_the_worker_ends_while_streams_are_open_fails_them_as_unavailable(scripted, mux):
    task = _run(mux, "open")
    call = await scripted.next_call()
    await call.next_start()
    call.end()
    with pytest.raises(WorkerUnavailableError, match="ended the stream call"):
        await _result(task)


async def test_after_a_broken_call_the_next_request_opens_a_new_one(scripted):
    client = WorkerClient(scripted.address)
    try:
        broken = asyncio.ensure_future(_texts(client.generate(_request("before"))))
        first_call: ScriptedCall = await scripted.next_call()
        await first_call.next_start()
        first_call.fail(grpc.StatusCode.UNAVAILABLE, "connection reset")
        with pytest.raises(WorkerUnavailableError):
            await _result(broken)

        after = asyncio.ensure_future(_texts(client.generate(_request("after"))))
        second_call = await scripted.next_call()
        start = await second_call.next_start()
        assert start.start.request_id == "after"
        second_call.send(event(start.stream, "served", done=True))
        assert await _result(after) == ["served"]
    finally:
        await client.close()


async def test_one_call_per_request_names_the_refused_field_from_trailing_metadata(scripted):
    scripted.refusals["bad"] = (grpc.StatusCode.INVALID_ARGUMENT, "max_tokens is too large", "max_tokens")
    scripted.refusals["vague"] = (grpc.StatusCode.INVALID_ARGUMENT, "the request is bad", None)
    scripted.refusals["dup"] = (grpc.StatusCode.ALREADY_EXISTS, "request dup is already running", None)
    client = WorkerClient(scripted.address, ClientOptions(multiplex=False))
    try:
        with pytest.raises(InvalidRequestError) as refused:
            await _result(asyncio.ensure_future(_texts(client.generate(_request("bad")))))
        assert refused.value.param == "max_tokens"
        with pytest.raises(InvalidRequestError) as vague:
            await _result(asyncio.ensure_future(_texts(client.generate(_request("vague")))))
        assert vague.value.param is None
        with pytest.raises(DuplicateRequestError):
            await _result(asyncio.ensure_future(_texts(client.generate(_request("dup")))))
        assert await _texts(client.generate(_request("fine"), timeout=WAIT_S)) == ["ok"]
    finally:
        await client.close()


class _HandCall:
    """A GenerateMany call whose responses the test hands over; several at once arrive together."""

    def __init__(self) -> None:
        self.responses: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self):
        response = await self.responses.get()
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        self.responses.put_nowait(None)


class _HandStub:
    def __init__(self) -> None:
        self.call = _HandCall()
        self.requests = None

    def GenerateMany(self, requests):  # noqa: N802 (gRPC's name)
        self.requests = requests
        return self.call


async def test_events_that_wait_for_a_slow_consumer_reach_it_as_one_chunk_per_stream():
    from vllm_fleet.protocol import worker_pb2 as pb

    stub = _HandStub()
    mux = Multiplexer(stub, "hand:1")
    try:
        chunks = mux.generate(_request("r"), timeout=None)
        first = asyncio.ensure_future(anext(chunks))
        start = await asyncio.wait_for(anext(stub.requests), WAIT_S)  # the stream is open
        stub.call.responses.put_nowait(pb.MuxResponse(events=[event(start.stream, "a")]))
        first = await asyncio.wait_for(first, WAIT_S)
        assert (first.text, first.token_ids) == ("a", [])
        # The consumer is busy elsewhere while three messages arrive: it then takes them as one.
        for response in (event(start.stream, "b"), event(start.stream, "c"), event(start.stream, "d", done=True)):
            stub.call.responses.put_nowait(pb.MuxResponse(events=[response]))
        rest = [chunk.text async for chunk in chunks]
        assert rest == ["bcd"]
    finally:
        await mux.close()
