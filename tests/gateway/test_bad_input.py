"""Every bad request gets its documented status and OpenAI error body, and the gateway keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway_support import CONTEXT, MODEL_A, MODEL_B

GOOD = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


async def still_serves(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/chat/completions", json=GOOD)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]


@pytest.fixture
async def http(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        yield client


CASES = [
    # (name, path, raw body or json, status, param)
    ("n too large", "/v1/chat/completions", {**GOOD, "n": 17}, 400, "n"),
    ("max_tokens 0", "/v1/chat/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens too large", "/v1/chat/completions", {**GOOD, "max_tokens": CONTEXT + 1}, 400, "max_tokens"),
    ("prompt too long", "/v1/completions", {"model": MODEL_A, "prompt": "word " * CONTEXT * 2}, 400, "prompt"),
    ("prompt too long, 3 MB body", "/v1/completions", {"model": MODEL_A, "prompt": "x" * 3_000_000}, 400, "prompt"),
    ("token prompt too long", "/v1/completions", {"model": MODEL_A, "prompt": [1] * CONTEXT}, 400, "prompt"),
    ("messages not a list", "/v1/chat/completions", {**GOOD, "messages": "hi"}, 400, "messages"),
    ("temperature a string", "/v1/chat/completions", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("stream a number", "/v1/chat/completions", {**GOOD, "stream": 3}, 400, "stream"),
    ("model missing", "/v1/chat/completions", {"messages": GOOD["messages"]}, 400, "model"),
    ("prompt of objects", "/v1/completions", {"model": MODEL_A, "prompt": [{"a": 1}]}, 400, "prompt"),
    ("invalid JSON", "/v1/chat/completions", b'{"model": ', 400, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("empty body", "/v1/completions", b"", 400, None),
    ("unknown model", "/v1/chat/completions", {**GOOD, "model": "gpt-17"}, 404, "model"),
]


@pytest.mark.parametrize("name, path, body, status, param", CASES, ids=[c[0] for c in CASES])
async def test_bad_request_then_good_one(http, name, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = await http.post(path, content=content, headers={"content-type": "application/json"})
    error = error_of(reply, status)
    assert error["param"] == param
    await still_serves(http)


async def test_body_too_large_is_413(http):
    huge = {**GOOD, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    error = error_of(await http.post("/v1/chat/completions", json=huge), 413)
    assert error["code"] == "request_too_large"
    await still_serves(http)


async def test_unknown_route_and_method(http):
    assert error_of(await http.get("/v1/nothing"), 404)["code"] == "not_found"
    reply = await http.get("/v1/chat/completions")
    assert error_of(reply, 405)["code"] == "method_not_allowed"
    assert reply.headers["allow"] == "POST"
    await still_serves(http)


async def test_request_id_is_honoured_or_made(http):
    reply = await http.post("/v1/chat/completions", json=GOOD, headers={"x-request-id": "trace-42"})
    assert reply.headers["x-request-id"] == "trace-42"
    assert reply.json()["id"] == "chatcmpl-trace-42"
    made = (await http.get("/health")).headers["x-request-id"]
    assert len(made) == 32


async def test_health_ready_metrics(http):
    assert (await http.get("/health")).json() == {"status": "ok"}
    ready = await http.get("/ready")
    assert ready.status_code == 200 and ready.json()["serving_workers"] == 3
    await still_serves(http)
    metrics = (await http.get("/metrics")).text
    for name in ("vllm_fleet_gateway_time_to_first_token_seconds_bucket", "vllm_fleet_gateway_request_duration_seconds",
                 "vllm_fleet_gateway_tokens_total", 'vllm_fleet_router_breaker_state{worker=',
                 "vllm_fleet_router_in_flight", "vllm_fleet_router_queue_depth", "vllm_fleet_worker_running"):
        assert name in metrics, name


async def test_ready_is_503_without_workers(start_gateway, mock_worker_factory):
    worker = await mock_worker_factory.start()
    server = await start_gateway([worker.address])
    worker.kill()
    from support import wait_until

    async with httpx.AsyncClient(base_url=server.url) as http:
        async def not_ready() -> bool:
            return (await http.get("/ready")).status_code == 503
        await wait_until(not_ready, timeout=20, message="/ready to say 503")
        reply = await http.post("/v1/chat/completions", json={**GOOD, "model": "mock-model"})
        assert reply.status_code in (503, 404)
        assert (await http.get("/health")).status_code == 200


async def test_openapi_describes_the_request_schemas(http):
    doc = (await http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages", "n", "max_tokens", "logprobs", "top_logprobs"} <= set(chat["properties"])
    assert set(chat["required"]) == {"model", "messages"}
    assert "413" in doc["paths"]["/v1/completions"]["post"]["responses"]
    n = chat["properties"]["n"]["anyOf"][0]
    assert (n["type"], n["minimum"]) == ("integer", 1)  # JSON Schema keywords, not pydantic's
    assert "security" not in doc["paths"]["/v1/completions"]["post"]  # no keys file: open (on loopback)


async def test_unknown_model_names_the_served_ones(http):
    """The router's UnknownModelError reaches the client as OpenAI's 404, listing what is served."""
    error = error_of(await http.post("/v1/completions", json={"model": "gpt-17", "prompt": "x"}), 404)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_not_found", "model")
    assert "gpt-17" in error["message"] and MODEL_A in error["message"] and MODEL_B in error["message"]
    streamed = await http.post("/v1/chat/completions", json={**GOOD, "model": "gpt-17", "stream": True})
    assert error_of(streamed, 404)["code"] == "model_not_found"  # refused before any SSE byte
    await still_serves(http)
