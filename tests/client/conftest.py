"""An in-process scripted worker per test (tests/client/scripted_worker.py)."""

from __future__ import annotations

import grpc
import pytest
from scripted_worker import ScriptedWorker

from vllm_fleet.protocol import worker_pb2_grpc


@pytest.fixture
async def scripted():
    worker = ScriptedWorker()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    worker.address = f"127.0.0.1:{port}"
    try:
        yield worker
    finally:
        await server.stop(None)
