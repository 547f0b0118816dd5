"""LoRA adapters on a worker (#16): the registry's checks and LRU, and the RPCs on a mock worker."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import InvalidRequestError, UnknownModelError, WorkerOverloadedError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request, worker_pb2_grpc
from vllm_fleet.worker.adapters import AdapterRegistry, HeldAdapter
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.service import WorkerService


def make_adapter(folder, rank: int = 8):
    """A folder that passes the worker's checks (the mock holds no weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": ["q_proj", "v_proj"]}))
    return str(folder)


class _Engine:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []

    async def add(self, held: HeldAdapter) -> None:
        self.added.append(held.name)

    async def remove(self, held: HeldAdapter) -> None:
        self.removed.append(held.name)


async def test_full_registry_evicts_the_least_recently_used_idle_adapter(tmp_path):
    now = [0.0]
    registry = AdapterRegistry(2, 8, base_model=lambda: "base", clock=lambda: now[0])
    engine = _Engine()
    for name in ("a", "b"):
        now[0] += 1
        await registry.load(name, make_adapter(tmp_path / name), engine.add, engine.remove)
    now[0] += 1
    registry.release(registry.acquire("a"))  # a is used after b: b is the least recent
    now[0] += 1
    await registry.load("c", make_adapter(tmp_path / "c"), engine.add, engine.remove)
    assert engine.removed == ["b"] and sorted(registry.names()) == ["a", "c"]
    # An adapter with a running request is never evicted; all busy → refused for capacity.
    busy = [registry.acquire("a"), registry.acquire("c")]
    with pytest.raises(WorkerOverloadedError):
        await registry.load("d", make_adapter(tmp_path / "d"), engine.add, engine.remove)
    for held in busy:
        registry.release(held)


async def test_bad_folder_and_rank_are_refused_naming_the_field(tmp_path):
    registry = AdapterRegistry(2, 8, base_model=lambda: "base")
    engine = _Engine()
    with pytest.raises(InvalidRequestError) as bad:
        await registry.load("x", str(tmp_path / "missing"), engine.add, engine.remove)
    assert bad.value.param == "lora_path"
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequestError) as empty:
        await registry.load("x", str(tmp_path / "empty"), engine.add, engine.remove)
    assert empty.value.param == "lora_path"
    with pytest.raises(InvalidRequestError) as rank:
        await registry.load("x", make_adapter(tmp_path / "r16", rank=16), engine.add, engine.remove)
    assert rank.value.param == "rank" and "16" in str(rank.value)
    assert engine.added == [] and registry.names() == []


async def test_unload_waits_for_running_requests_and_refuses_new_ones(tmp_path):
    registry = AdapterRegistry(1, 8, base_model=lambda: "base")
    engine = _Engine()
    await registry.load("a", make_adapter(tmp_path / "a"), engine.add, engine.remove)
    running = registry.acquire("a")
    unload = asyncio.create_task(registry.unload("a", engine.remove))
    await wait_until(lambda: registry.names() == [], timeout=5, message="the unload to begin")
    with pytest.raises(WorkerOverloadedError):
        registry.acquire("a")  # new requests go elsewhere
    assert not unload.done() and engine.removed == []
    registry.release(running)
    await asyncio.wait_for(unload, 5)
    assert engine.removed == ["a"]
    with pytest.raises(UnknownModelError):
        await registry.unload("a", engine.remove)


# ---------------------------------------------------------------------------------- on the wire

@pytest.fixture
async def lora_worker():
    engine = MockEngine(EngineConfig(engine="mock", mock_tokens_per_s=2000, mock_ttft_ms=1, max_loras=2,
                                     max_lora_rank=8))
    await engine.start()
    service = WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry()))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = WorkerClient(f"127.0.0.1:{port}")
    try:
        yield client, service
    finally:
        await client.close()
        await server.stop(None)


async def _text(client: WorkerClient, adapter: str = "") -> str:
    request = build_request("", [GenerateInput(text="tell me")], SamplingParams(max_tokens=12), adapter=adapter)
    return "".join([c.text async for c in client.generate(request, timeout=30)])


async def test_adapter_rpcs_and_generation(lora_worker, tmp_path):
    client, service = lora_worker
    adapters, slots = await client.load_adapter("sql", make_adapter(tmp_path / "sql"))
    assert slots == 2 and [(a.name, a.rank, a.base_model) for a in adapters] == [("sql", 8, "mock-model")]
    # Loading the same again is a no-op (two routers may race to place it); once in the engine.
    await client.load_adapter("sql", str(tmp_path / "sql"))
    assert service.adapters.loads == 1
    load = await client.load()
    assert load.adapters == ["sql"] and load.max_adapters == 2
    base, tuned = await _text(client), await _text(client, "sql")
    assert base and tuned and base != tuned
    with pytest.raises(WorkerOverloadedError):  # not held here: a router places it elsewhere
        await _text(client, "other")
    with pytest.raises(InvalidRequestError) as bad:
        await client.load_adapter("bad", str(tmp_path / "nowhere"))
    assert bad.value.param == "lora_path"
    with pytest.raises(InvalidRequestError) as rank:
        await client.load_adapter("big", make_adapter(tmp_path / "big", rank=64))
    assert rank.value.param == "rank"
    adapters, _ = await client.unload_adapter("sql")
    assert adapters == [] and (await client.list_adapters())[0] == []
    assert await _text(client) == base  # the worker serves on after every refusal


async def test_a_worker_without_lora_refuses_adapter_requests(tmp_path):
    engine = MockEngine(EngineConfig(engine="mock", mock_ttft_ms=1))
    service = WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry()))
    with pytest.raises(InvalidRequestError) as off:
        await service.adapters.load("a", make_adapter(tmp_path / "a"), engine.add_adapter, engine.remove_adapter)
    assert off.value.param == "lora_name"


async def test_bad_lora_options_are_config_errors_naming_the_option(tmp_path):
    from vllm_fleet.config import validated
    from vllm_fleet.errors import ConfigError

    with pytest.raises(ConfigError, match="--max-lora-rank"):
        validated(EngineConfig, {"engine": "mock", "max_lora_rank": 12})  # vLLM takes 8 or 16, not 12
    config = EngineConfig(engine="mock", mock_ttft_ms=1, lora=["no-equals-sign", f"x={tmp_path / 'missing'}"])
    assert config.adapter_slots == 2  # one slot per --lora when --max-loras is not given
    engine = MockEngine(config)
    service = WorkerService(engine, WorkerConfig(), WorkerMetrics(CollectorRegistry()))
    with pytest.raises(ConfigError, match="name=path"):
        await service.load_static_adapters(config.lora[:1])
    with pytest.raises(ConfigError, match="lora_path"):
        await service.load_static_adapters(config.lora[1:])
