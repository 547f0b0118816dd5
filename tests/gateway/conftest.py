"""Gateways started in-process (the test's event loop) in front of mock worker processes."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.keys import KeyRecord, hash_key, write_keys
from vllm_fleet.gateway.server import GatewayServer
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import RouterConfig

from gateway_support import CONTEXT, MODEL_A, MODEL_B


@pytest.fixture(scope="session")
async def mock_fleet(session_mock_workers):
    """Two workers of model A, one of model B; fast tokens so streams are quick."""
    common = dict(mock_tokens_per_s=2000, mock_ttft_ms=2, mock_max_model_len=CONTEXT)
    a1, a2, b = await asyncio.gather(session_mock_workers.start(served_model_name=MODEL_A, **common),
                                     session_mock_workers.start(served_model_name=MODEL_A, **common),
                                     session_mock_workers.start(served_model_name=MODEL_B, **common))
    return {"a": [a1, a2], "b": [b]}


@pytest.fixture
async def start_gateway(tmp_path):
    """`await start_gateway(addresses, router=RouterConfig(...), **gateway_options)` → a serving GatewayServer.
    Batch state goes to the test's own folder unless given: never the user's default one."""
    servers: list[GatewayServer] = []

    async def start(addresses: list[str], *, router: RouterConfig | None = None, **options) -> GatewayServer:
        options.setdefault("batch_dir", str(tmp_path / "batch"))
        config = GatewayConfig(port=0, **options)
        server = GatewayServer(config, router or RouterConfig(), StaticRegistry.from_spec(addresses),
                               ready_timeout_s=20, shutdown_grace_s=2)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def gateway(start_gateway, mock_fleet):
    """A key-less (loopback) gateway over both models."""
    addresses = [w.address for w in mock_fleet["a"] + mock_fleet["b"]]
    server = await start_gateway(addresses)
    await _wait_models(server, {MODEL_A, MODEL_B})
    return server


@pytest.fixture
def keys_file(tmp_path):
    """Keys: 'polite' and 'abusive' (5 requests/min), 'ops' (admin). Returns (path, {id: key})."""
    keys = {"polite": "sk-test-polite", "abusive": "sk-test-abusive", "ops": "sk-test-ops"}
    path = tmp_path / "keys.jsonl"
    write_keys(path, [
        KeyRecord("polite", hash_key(keys["polite"])),
        KeyRecord("abusive", hash_key(keys["abusive"]), limits={"requests_per_min": 5}),
        KeyRecord("ops", hash_key(keys["ops"]), admin=True),
    ])
    return path, keys


async def _wait_models(server: GatewayServer, models: set[str]) -> None:
    from support import wait_until

    await wait_until(lambda: models <= set(server.router.models()), timeout=20, message=f"models {models}")
