"""Chaos scenarios: faults injected into real worker processes behind a real gateway/router.

Workers are mock-engine processes (the faults are about the control plane), except where the
scenario is about the engine. Gateways run in the test's event loop.
"""

from __future__ import annotations

import pytest

from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.server import GatewayServer
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import RouterConfig


@pytest.fixture
async def start_gateway():
    """`await start_gateway(addresses, router=RouterConfig(...), **gateway_options)` → a serving GatewayServer."""
    servers: list[GatewayServer] = []

    async def start(addresses: list[str], *, router: RouterConfig | None = None, grace_s: float = 5,
                    ready_timeout_s: float = 20, **options) -> GatewayServer:
        server = GatewayServer(GatewayConfig(port=0, **options), router or RouterConfig(),
                               StaticRegistry.from_spec(",".join(addresses)), ready_timeout_s=ready_timeout_s,
                               shutdown_grace_s=grace_s)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def workers(mock_worker_factory):
    """`await workers(n, **mock_options)` → n fresh mock workers, stopped (or killed) after the test."""
    started = []

    async def start(n: int, **options):
        options.setdefault("served_model_name", "chaos")
        batch = await mock_worker_factory.start_many(n, **options)
        started.extend(batch)
        return batch

    yield start
    for worker in started:
        worker.kill()
