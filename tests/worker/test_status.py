"""Errors → gRPC statuses: the one mapping, and what each transport sends for it."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from vllm_fleet.client.errors import error_from_status
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    WorkerOverloadedError,
    WorkerUnavailableError,
)
from vllm_fleet.protocol import PARAM_METADATA_KEY, GenerateInput, GenerateRequest, SamplingParams, build_request
from vllm_fleet.protocol import worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import request_to_pb
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.service import WorkerService
from vllm_fleet.worker.status import status_for

Code = grpc.StatusCode

MAPPING = [
    (InvalidRequestError("max_tokens must be at least 1", param="max_tokens"), True, Code.INVALID_ARGUMENT, "max_tokens"),
    (InvalidRequestError("bad", param="prompt"), False, Code.INVALID_ARGUMENT, "prompt"),  # a decision, not a death
    (ValueError("grammar does not compile"), True, Code.INVALID_ARGUMENT, None),
    (TypeError("bad type"), True, Code.INVALID_ARGUMENT, None),
    (WorkerUnavailableError("worker is draining"), True, Code.UNAVAILABLE, None),
    (DuplicateRequestError("request r is already running"), True, Code.ALREADY_EXISTS, None),
    (WorkerOverloadedError("queue full"), True, Code.RESOURCE_EXHAUSTED, None),
    (RuntimeError("boom"), True, Code.INTERNAL, None),
    (RuntimeError("boom"), False, Code.UNAVAILABLE, None),
    (ValueError("cuda error"), False, Code.UNAVAILABLE, None),
]


@pytest.mark.parametrize("exc, engine_healthy, code, param", MAPPING,
                         ids=[f"{type(e).__name__}-{'up' if h else 'dead'}" for e, h, _, _ in MAPPING])
def test_each_error_maps_to_its_documented_status(exc, engine_healthy, code, param):
    status = status_for(exc, engine_healthy=engine_healthy)
    assert (status.code, status.param) == (code, param)
    assert str(exc) in status.message
    if not engine_healthy and code == Code.UNAVAILABLE:
        assert "the engine died" in status.message


@pytest.mark.parametrize("exc", [InvalidRequestError("x", param="n"), DuplicateRequestError("x"),
                                 WorkerOverloadedError("x"), WorkerUnavailableError("x")])
def test_the_client_reads_back_the_type_the_worker_raised(exc):
    status = status_for(exc)
    back = error_from_status(status.code_value, status.message, "w:1", param=status.param)
    assert isinstance(back, type(exc))
    assert getattr(back, "param", None) == getattr(exc, "param", None)


# ---------------------------------------------------------------------------------- on the wire

class _FailingEngine(MockEngine):
    """The mock engine, failing each request with `error` after its first step (and dying, if told)."""

    def __init__(self) -> None:
        super().__init__(EngineConfig(engine="mock", mock_tokens_per_s=1000, mock_ttft_ms=0))
        self.error: Exception | None = None
        self.dies = False

    async def generate(self, *args, **kwargs):
        async for deltas in super().generate(*args, **kwargs):
            yield deltas
            if self.error is not None:
                self._alive = not self.dies
                raise self.error


@pytest.fixture
async def served():
    engine = _FailingEngine()
    await engine.start()
    service = WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry()))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield engine, service, worker_pb2_grpc.WorkerStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def _generate_status(stub, request: GenerateRequest) -> tuple[Code, str, str | None]:
    """How a Generate call ends: code, details and the field named in trailing metadata."""
    try:
        async for _ in stub.Generate(request_to_pb(request), timeout=30):
            pass
    except grpc.aio.AioRpcError as failed:
        param = dict(failed.trailing_metadata() or ()).get(PARAM_METADATA_KEY)
        return failed.code(), failed.details(), param
    return Code.OK, "", None


async def _many_status(stub, request: GenerateRequest) -> tuple[Code, str, str | None]:
    """How the same request ends over GenerateMany: its last event's status."""
    call = stub.GenerateMany(timeout=30)
    try:
        await call.write(pb.MuxRequest(stream=1, start=request_to_pb(request)))
        while True:
            for event in (await call.read()).events:
                if event.done:
                    return Code.OK if not event.status_code else _code(event.status_code), \
                        event.status_message, event.status_param or None
    finally:
        call.cancel()


def _code(value: int) -> Code:
    return next(code for code in Code if code.value[0] == value)


TRANSPORTS = [pytest.param(_generate_status, id="Generate"), pytest.param(_many_status, id="GenerateMany")]


@pytest.mark.parametrize("ends", TRANSPORTS)
async def test_a_refused_request_names_its_field_on_both_transports(served, ends):
    _, _, stub = served
    bad = build_request("bad", [GenerateInput(text="a")], SamplingParams(max_tokens=0))  # vLLM refuses it
    code, message, param = await ends(stub, bad)
    assert (code, param) == (Code.INVALID_ARGUMENT, "max_tokens")
    assert "max_tokens must be at least 1" in message


@pytest.mark.parametrize("ends", TRANSPORTS)
@pytest.mark.parametrize("error, dies, code", [
    (RuntimeError("kernel fault"), False, Code.INTERNAL),
    (ValueError("grammar does not compile"), False, Code.INVALID_ARGUMENT),
    (RuntimeError("engine core exited"), True, Code.UNAVAILABLE),
])
async def test_an_engine_failure_mid_stream_ends_the_request_with_its_status(served, ends, error, dies, code):
    engine, service, stub = served
    engine.error, engine.dies = error, dies
    status = await ends(stub, build_request("fails", [GenerateInput(text="a")], SamplingParams(max_tokens=50)))
    assert status[0] == code and str(error) in status[1]
    assert not service.active  # the request is over on the worker too


@pytest.mark.parametrize("ends", TRANSPORTS)
async def test_a_draining_worker_refuses_new_requests_as_unavailable(served, ends):
    _, service, stub = served
    service.draining = True
    code, message, _ = await ends(stub, build_request("late", [GenerateInput(text="a")]))
    assert code == Code.UNAVAILABLE and "draining" in message


async def test_a_request_id_already_running_is_refused_as_already_exists(served):
    _, _, stub = served
    long = build_request("twice", [GenerateInput(text="a")], SamplingParams(max_tokens=4000))
    first = stub.Generate(request_to_pb(long), timeout=30)
    await first.read()  # it runs
    try:
        for ends in (_generate_status, _many_status):
            code, message, _ = await ends(stub, long)
            assert code == Code.ALREADY_EXISTS and "twice" in message
    finally:
        first.cancel()


async def test_a_stream_number_already_open_on_the_call_is_refused_as_already_exists(served):
    _, _, stub = served
    call = stub.GenerateMany(timeout=30)
    long = build_request("mux-long", [GenerateInput(text="a")], SamplingParams(max_tokens=4000))
    await call.write(pb.MuxRequest(stream=7, start=request_to_pb(long)))
    await call.write(pb.MuxRequest(stream=7, start=request_to_pb(build_request("other", [GenerateInput(text="b")]))))
    try:
        while True:
            done = [e for e in (await call.read()).events if e.done]
            if done:
                break
        assert (done[0].stream, _code(done[0].status_code)) == (7, Code.ALREADY_EXISTS)
    finally:
        call.cancel()
