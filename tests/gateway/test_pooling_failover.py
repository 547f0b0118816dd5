"""Pooling routing on mock workers (`--mock-pooling`, the named stand-in of an embedding model):
a worker killed with embedding requests in flight costs the clients nothing (a pooling request
is idempotent, so the router sends it to the other worker), and a pooling route on a generating
model is a 400 naming the model."""

from __future__ import annotations

import asyncio
import signal

import httpx
import openai
import pytest

from vllm_fleet.worker.engines.mock_pooling import mock_vector

from gateway_support import MODEL_A
from support import wait_until

EMBEDDER = "mock-embedder"


async def test_a_worker_killed_mid_request_loses_no_embedding(start_gateway, mock_worker_factory):
    first, second = await mock_worker_factory.start_many(2, served_model_name=EMBEDDER, mock_pooling=True,
                                                         mock_ttft_ms=1500, timeout=300)
    server = await start_gateway([first.address, second.address])
    await wait_until(lambda: sum(w.state == "serving" for w in server.router.snapshot()) == 2, timeout=30,
                     message="both mock embedders serving")
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    texts = [f"text {i}" for i in range(12)]
    calls = [asyncio.create_task(client.embeddings.create(model=EMBEDDER, input=t, encoding_format="float"))
             for t in texts]
    # Kill the first worker while it holds some of them (each takes 1.5 s there).
    await wait_until(lambda: (v := server.router.snapshot().get(first.address)) is not None and v.in_flight >= 2,
                     timeout=10, message="requests in flight on the first worker")
    first.process.send_signal(signal.SIGKILL)
    replies = await asyncio.gather(*calls)
    assert [r.data[0].embedding for r in replies] == [pytest.approx(mock_vector(t)) for t in texts]


async def test_pooling_route_on_a_generating_model_is_a_400(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post("/v1/embeddings", json={"model": MODEL_A, "input": "x"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "model" and MODEL_A in error["message"] and "/v1/embeddings" in error["message"]
