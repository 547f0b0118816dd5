"""GenerateMany: many requests of one client over one call, their chunks batched per message."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import InvalidRequestError, WorkerTimeoutError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request, worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import request_to_pb
from vllm_fleet.worker.engines.base import build_engine
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.service import WorkerService


@pytest.fixture(scope="module")
async def mock(module_mock_workers):
    worker = await module_mock_workers.start(mock_tokens_per_s=400, mock_ttft_ms=5)
    client = WorkerClient(worker.address)
    yield worker, client
    await client.close()


async def _idle(client: WorkerClient) -> bool:
    load = await client.load()
    return load.running == 0 and load.in_flight == 0


async def test_one_call_carries_every_stream_in_fewer_messages_than_chunks(mock):
    worker, _ = mock
    streams, tokens = 48, 40
    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMany()
        for stream in range(1, streams + 1):
            request = build_request(f"mux-{stream}", [GenerateInput(token_ids=[5, 6, stream % 40 + 1])],
                                      SamplingParams(max_tokens=tokens, ignore_eos=True))
            await call.write(pb.MuxRequest(stream=stream, start=request_to_pb(request)))
        received: dict[int, list[int]] = {s: [] for s in range(1, streams + 1)}
        done: set[int] = set()
        messages = chunks = 0
        multi_stream_messages = 0
        while len(done) < streams:
            response = await asyncio.wait_for(call.read(), 30)
            messages += 1
            multi_stream_messages += len({e.stream for e in response.events}) > 1
            for event in response.events:
                for chunk in event.chunks:
                    chunks += 1
                    received[event.stream].extend(chunk.token_ids)
                if event.done:
                    assert event.status_code == 0, event.status_message
                    done.add(event.stream)
        await call.done_writing()
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.OK
    assert all(len(ids) == tokens for ids in received.values())
    assert multi_stream_messages > 0
    print(f"{messages} messages for {chunks} chunks")
    assert messages < chunks / 2, f"{messages} messages for {chunks} chunks: no batching"


async def test_starts_and_cancels_batched_in_one_message_are_each_carried_out(mock):
    worker, client = mock
    tokens = 6

    def start(stream: int, max_tokens: int = tokens) -> pb.MuxRequest:
        request = build_request(f"batched-{stream}", [GenerateInput(token_ids=[5, 6, stream])],
                                  SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        return pb.MuxRequest(stream=stream, start=request_to_pb(request))

    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMany()
        # Stream 4 is long and cancelled in the same message that starts it; 1-3 run to the end.
        await call.write(pb.MuxRequest(stream=1, start=start(1).start,
                                       batched=[start(2), start(3), start(4, 100_000),
                                                pb.MuxRequest(stream=4, cancel=True)]))
        received: dict[int, int] = {}
        done: set[int] = set()
        while done != {1, 2, 3}:
            response = await asyncio.wait_for(call.read(), 30)
            for event in response.events:
                assert event.stream != 4, "the cancelled stream still sent events"
                received[event.stream] = received.get(event.stream, 0) + sum(len(c.token_ids) for c in event.chunks)
                if event.done:
                    assert event.status_code == 0, event.status_message
                    done.add(event.stream)
        assert received == {1: tokens, 2: tokens, 3: tokens}
        await call.done_writing()
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.OK
    await wait_until(lambda: _idle(client), timeout=10, message="the cancelled request aborted on the worker")


async def test_cancelling_one_stream_aborts_it_and_leaves_the_others(mock):
    _, client = mock
    long = client.generate(build_request("mux-long", [GenerateInput(text="a")], SamplingParams(max_tokens=4000)))
    await long.__anext__()
    short = [c async for c in client.generate(build_request("mux-short", [GenerateInput(text="b")],
                                                              SamplingParams(max_tokens=8)), timeout=30)]
    assert short[-1].finish_reason == "length"
    assert (await client.load()).in_flight == 1
    await long.aclose()
    await wait_until(lambda: _idle(client), timeout=10, message="the cancelled request aborted on the worker")
    # The call is still good for the next request.
    again = [c async for c in client.generate(build_request("mux-again", [GenerateInput(text="c")],
                                                              SamplingParams(max_tokens=4)), timeout=30)]
    assert sum(len(c.token_ids) for c in again) == 4


async def test_a_deadline_ends_the_stream_and_the_worker_aborts_it(mock):
    _, client = mock
    with pytest.raises(WorkerTimeoutError, match="deadline"):
        async for _ in client.generate(build_request("mux-slow", [GenerateInput(text="a")],
                                                       SamplingParams(max_tokens=4000)), timeout=0.5):
            pass
    await wait_until(lambda: _idle(client), timeout=10, message="the timed-out request aborted on the worker")


async def test_errors_end_only_their_own_stream(mock):
    _, client = mock
    good = client.generate(build_request("mux-good", [GenerateInput(text="a")], SamplingParams(max_tokens=30)),
                           timeout=30)
    first = await good.__anext__()
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        async for _ in client.generate(build_request("mux-bad", [GenerateInput(text="a")],
                                                       SamplingParams(max_tokens=-1))):
            pass
    rest = [c async for c in good]
    assert len(first.token_ids) + sum(len(c.token_ids) for c in rest) == 30


class _WorkerWithoutGenerateMany(WorkerService):
    """A worker without GenerateMany (the base servicer answers UNIMPLEMENTED), counting the calls
    each method gets."""

    stream_calls = 0
    generate_calls = 0

    def GenerateMany(self, request_iterator, context):
        type(self).stream_calls += 1
        return worker_pb2_grpc.WorkerServicer.GenerateMany(self, request_iterator, context)

    async def Generate(self, request_pb, context):
        type(self).generate_calls += 1
        async for chunk in super().Generate(request_pb, context):
            yield chunk


class _WorkerWhoseStreamCallFailsAtOnce(WorkerService):
    """Closes every GenerateMany call with INTERNAL before answering: what grpcio reports when the
    client's first write loses the race with a worker that has no GenerateMany (its UNIMPLEMENTED
    is then lost), made certain here."""

    stream_calls = 0

    async def GenerateMany(self, request_iterator, context):
        type(self).stream_calls += 1
        await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        yield  # never reached: makes this a streaming handler


async def _two_requests_through(servicer: type[WorkerService]) -> None:
    """Two 5-token requests from a multiplexing client to a mock worker served by `servicer`:
    each must stream in full."""
    engine = build_engine(EngineConfig(engine="mock", mock_tokens_per_s=1000))
    await engine.start()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(
        servicer(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry())), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = WorkerClient(f"127.0.0.1:{port}", ClientOptions(multiplex=True))
    try:
        for attempt in range(2):
            chunks = [c async for c in client.generate(build_request(f"{servicer.__name__}-{attempt}",
                                                                       [GenerateInput(text="a")],
                                                                       SamplingParams(max_tokens=5)), timeout=30)]
            assert sum(len(c.token_ids) for c in chunks) == 5
    finally:
        await client.close()
        await server.stop(None)
        await engine.shutdown()


async def test_a_worker_without_generate_many_gets_one_call_per_request():
    worker = _WorkerWithoutGenerateMany
    generate_before, stream_before = worker.generate_calls, worker.stream_calls
    await _two_requests_through(worker)
    assert worker.generate_calls == generate_before + 2, "each request is a Generate call of its own"
    # The stream call is tried first; once its UNIMPLEMENTED arrives it is not tried again. When
    # the first write loses the race with the refusal, grpcio says INTERNAL instead
    # (_WorkerWhoseStreamCallFailsAtOnce), and the second request tries it once more.
    assert 1 <= worker.stream_calls - stream_before <= 2


async def test_a_stream_call_that_fails_before_answering_leaves_each_request_served_by_its_own_call():
    calls_before = _WorkerWhoseStreamCallFailsAtOnce.stream_calls
    await _two_requests_through(_WorkerWhoseStreamCallFailsAtOnce)
    # Not taken for "no GenerateMany": the next request tried the stream call again.
    assert _WorkerWhoseStreamCallFailsAtOnce.stream_calls == calls_before + 2


async def test_the_call_brings_the_workers_load_and_health_so_routers_need_not_poll(mock):
    """Routers skip their Load poll and health check when a stream call or a Load answer already
    said it (see router/pool/membership.py); both must carry the worker's real state."""
    _, client = mock
    assert (await client.load()).health == "SERVING"
    client.take_streamed_load()  # drop one a previous test's stream left
    request = build_request("mux-load", [GenerateInput(token_ids=[5, 6, 7])],
                              SamplingParams(max_tokens=120, ignore_eos=True))
    streamed = None
    async for _ in client.generate(request, timeout=30):
        streamed = streamed or client.take_streamed_load()
    assert streamed is not None, "no Load came with the stream call"
    assert streamed.health == "SERVING"
    assert streamed.in_flight >= 1  # taken while the request ran


async def test_an_idle_call_pushes_the_workers_load_when_asked(mock):
    """Asked for Loads every 50 ms, the worker sends them on the call with no request running,
    says so in each response, and a request on the same call still streams in full."""
    worker, _ = mock
    client = WorkerClient(worker.address)
    try:
        assert not client.pushes_load(0.05)  # asked now: the worker has not answered yet
        await wait_until(lambda: client.pushes_load(0.05), timeout=10, message="the worker says it pushes Loads")
        loads = [await client.next_pushed_load(timeout=5) for _ in range(4)]
        assert all(load is not None and load.health == "SERVING" and load.in_flight == 0 for load in loads)
        # Two pools may share a client: each waiting caller gets the next Load.
        first, second = await asyncio.gather(client.next_pushed_load(timeout=5), client.next_pushed_load(timeout=5))
        assert first is not None and first is second
        chunks = [c async for c in client.generate(
            build_request("pushed-load", [GenerateInput(token_ids=[5, 6])], SamplingParams(max_tokens=12,
                                                                                             ignore_eos=True)),
            timeout=30)]
        assert sum(len(c.token_ids) for c in chunks) == 12
        assert await client.next_pushed_load(timeout=5) is not None  # still pushing after the request
    finally:
        await client.close()


class _CountingClient(WorkerClient):
    """Counts its unary Load and health calls, which tell a polled Load from a pushed one."""

    unary = 0

    async def load(self, **kwargs):
        self.unary += 1
        return await super().load(**kwargs)

    async def health(self, **kwargs):
        self.unary += 1
        return await super().health(**kwargs)


async def test_loads_polls_a_worker_until_it_pushes_and_then_makes_no_unary_call(mock):
    """A router's one source of a worker's state (WorkerClient.loads): polled at first, then the
    worker's pushes over the stream call, each with its health, and no unary call at all."""
    worker, _ = mock
    client = _CountingClient(worker.address)
    try:
        async with contextlib.aclosing(client.loads(0.1, health_every_s=0.1)) as loads:
            first = await asyncio.wait_for(anext(loads), 10)
            assert first.health == "SERVING" and client.unary > 0  # polled: not asked to push yet
            polls = client.unary
            for _ in range(50):  # it says it pushes within a few turns
                await asyncio.wait_for(anext(loads), 10)
                if client.unary == polls:
                    break
                polls = client.unary
            else:
                pytest.fail("every Load was polled: the worker's pushes were never taken")
            pushed = [await asyncio.wait_for(anext(loads), 10) for _ in range(5)]
            assert all(load.health == "SERVING" for load in pushed)
            assert client.unary == polls
    finally:
        await client.close()


async def test_a_call_that_was_not_asked_pushes_no_load(mock):
    """Without load_every_ms the call stays silent while idle, as before the field."""
    worker, _ = mock
    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GenerateMany()
        read = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({read}, timeout=1.0)
        assert not done, "an idle call that asked for nothing got a message"
        await call.write(pb.MuxRequest(load_every_ms=20))
        response = await asyncio.wait_for(read, 10)
        assert response.load_every_ms == 20 and response.load.health == "SERVING" and not response.events
        call.cancel()


class _SlowToStop(MockEngine):
    """A mock engine whose requests take a moment to stop once cancelled, as vLLM's do (the abort
    goes to EngineCore and back); records what the worker aborts."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.stopping = asyncio.Event()   # a request was cancelled and is stopping
        self.aborted: list[str] = []

    async def generate(self, *args, **kwargs):
        try:
            async for deltas in super().generate(*args, **kwargs):
                yield deltas
        except asyncio.CancelledError:
            self.stopping.set()
            await asyncio.sleep(0.5)      # the stop's own latency, not a wait for the test
            raise

    async def abort(self, engine_request_ids: list[str]) -> None:
        self.aborted.extend(engine_request_ids)


async def test_a_stream_cancelled_and_then_its_whole_call_leaves_nothing_in_flight():
    """The client cancels a stream and then closes its channel (a router that closes right after
    its client left): the call's end cancels the stream's task a second time while it is still
    stopping. The request must still be aborted and leave the worker's requests in flight; it
    once stayed there for good (Load's in_flight 1, a drain that waited out its whole grace)."""
    engine = _SlowToStop(EngineConfig(engine="mock", mock_tokens_per_s=100))
    await engine.start()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(
        WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry())), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    probe = WorkerClient(address)
    try:
        request = build_request("left", [GenerateInput(token_ids=[5, 6, 7])],
                                  SamplingParams(max_tokens=900, ignore_eos=True), stream_interval_ms=50)
        async with grpc.aio.insecure_channel(address) as channel:
            call = worker_pb2_grpc.WorkerStub(channel).GenerateMany()
            await call.write(pb.MuxRequest(stream=1, start=request_to_pb(request)))
            while not any(event.chunks for event in (await asyncio.wait_for(call.read(), 30)).events):
                pass  # a Load alone
            await call.write(pb.MuxRequest(stream=1, cancel=True))
            await wait_until(engine.stopping.is_set, timeout=10, message="the cancel reached the engine")
            call.cancel()
        await wait_until(lambda: _nothing_in_flight(probe), timeout=5, message="the worker's in_flight back to 0")
        assert engine.aborted == ["left-0"]
    finally:
        await probe.close()
        await server.stop(None)
        await engine.shutdown()


async def _nothing_in_flight(client: WorkerClient) -> bool:
    return (await client.load()).in_flight == 0
