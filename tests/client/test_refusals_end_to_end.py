"""A refusal from the real worker service (mock engine, in-process) reaches the caller typed,
with the field it names, over both transports: what the gateway needs for its 400 `param`."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request, worker_pb2_grpc
from vllm_fleet.worker.engines.base import build_engine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.service import WorkerService


@pytest.fixture(scope="module")
async def worker_address():
    engine = build_engine(EngineConfig(engine="mock", mock_tokens_per_s=1000))
    await engine.start()
    server = grpc.aio.server()
    service = WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry()))
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
        await engine.shutdown()


@pytest.mark.parametrize("multiplex", [True, False], ids=["GenerateMany", "Generate"])
async def test_a_refused_request_names_its_field(worker_address, multiplex):
    client = WorkerClient(worker_address, ClientOptions(multiplex=multiplex))
    bad = build_request(f"bad-{multiplex}", [GenerateInput(text="a")], SamplingParams(max_tokens=-1))
    try:
        with pytest.raises(InvalidRequestError) as refused:
            async for _ in client.generate(bad, timeout=30):
                pass
        assert refused.value.param == "max_tokens"
        assert "max_tokens must be at least 1" in str(refused.value)  # vLLM's words: what to change
        # The worker keeps serving the same client.
        good = build_request(f"good-{multiplex}", [GenerateInput(text="a")], SamplingParams(max_tokens=3))
        assert sum([len(c.token_ids) async for c in client.generate(good, timeout=30)]) == 3
    finally:
        await client.close()
