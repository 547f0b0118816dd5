"""TokenizerFiles end to end, in process: the worker service (mock engine with a real tokenizer)
sends its tokenizer's files in chunks, the client writes them, and the router's tokenizer loads
them and tokenizes as the worker's tokenizer does. A worker without a tokenizer says so."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from model_files import copy_tokenizer_files
from vllm_fleet.client import WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import TokenizerFilesError
from vllm_fleet.protocol import worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.tokenizer_files import CHUNK_BYTES
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer
from vllm_fleet.worker.engines.base import build_engine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.service import WorkerService


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """The default model's tokenizer files, beside files that must never be sent."""
    folder = copy_tokenizer_files(tmp_path_factory.mktemp("mock-tokenizer"))
    (folder / "secret.txt").write_text("not a tokenizer file")
    (folder / "weights.safetensors").write_bytes(b"\0" * 16)
    return folder


async def _serve(engine_config: EngineConfig):
    engine = build_engine(engine_config)
    await engine.start()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry())),
                                                 server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return engine, server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
async def worker_with_tokenizer(tokenizer_folder):
    engine, server, address = await _serve(EngineConfig(engine="mock", mock_tokenizer=str(tokenizer_folder)))
    try:
        yield engine, address
    finally:
        await server.stop(None)
        await engine.shutdown()


async def test_the_worker_sends_its_tokenizer_files_in_chunks(worker_with_tokenizer, tokenizer_folder):
    _, address = worker_with_tokenizer
    async with grpc.aio.insecure_channel(address) as channel:
        chunks = [chunk async for chunk in worker_pb2_grpc.WorkerStub(channel).TokenizerFiles(pb.TokenizerFilesRequest())]
    names = sorted({chunk.name for chunk in chunks})
    assert names == ["chat_template.jinja", "config.json", "tokenizer.json", "tokenizer_config.json"]
    assert all(len(chunk.data) <= CHUNK_BYTES for chunk in chunks)
    json_chunks = [chunk for chunk in chunks if chunk.name == "tokenizer.json"]
    assert len(json_chunks) > 1 and [c.last for c in json_chunks] == [False] * (len(json_chunks) - 1) + [True]
    assert b"".join(c.data for c in json_chunks) == (tokenizer_folder / "tokenizer.json").read_bytes()


async def test_the_client_writes_files_the_router_tokenizes_with(worker_with_tokenizer, tmp_path):
    engine, address = worker_with_tokenizer
    client = WorkerClient(address)
    try:
        names = await client.tokenizer_files(tmp_path / "router")
    finally:
        await client.close()
    assert sorted(names) == ["chat_template.jinja", "config.json", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in (tmp_path / "router").iterdir()) == sorted(names)  # no partial files left
    router = PromptTokenizer.load(tmp_path / "router")
    text = "Grüße aus 北京 😀, naïve café"
    assert router.completion_ids(text) == list(engine.tokenizer(text)["input_ids"])
    messages = [{"role": "user", "content": text}]
    expected = engine.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False)
    assert router.chat_ids(messages) == list(expected)


async def test_a_worker_without_a_tokenizer_says_so(tmp_path):
    engine, server, address = await _serve(EngineConfig(engine="mock"))
    client = WorkerClient(address)
    try:
        with pytest.raises(TokenizerFilesError, match="no tokenizer") as refused:
            await client.tokenizer_files(tmp_path / "router")
        assert not refused.value.recoverable  # asking again gets the same answer
        assert not any((tmp_path / "router").iterdir())
    finally:
        await client.close()
        await server.stop(None)
        await engine.shutdown()
