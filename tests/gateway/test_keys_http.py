"""With a keys file: 401 without a valid key, per-key limits (429 + Retry-After), admin-only routes."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway_support import MODEL_A
from vllm_fleet.errors import ConfigError
from vllm_fleet.gateway.config import GatewayConfig

GOOD = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def keyed(start_gateway, mock_fleet, keys_file):
    path, keys = keys_file
    server = await start_gateway([w.address for w in mock_fleet["a"]], api_key_file=str(path))
    return server, keys


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


async def test_missing_or_wrong_key_is_401(keyed):
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url) as http:
        for headers in ({}, bearer("sk-wrong"), {"authorization": "Basic abc"}):
            reply = await http.post("/v1/chat/completions", json=GOOD, headers=headers)
            assert reply.status_code == 401
            assert reply.json()["error"]["type"] == "authentication_error"
        assert (await http.get("/v1/models")).status_code == 401
        reply = await http.post("/v1/chat/completions", json=GOOD, headers=bearer(keys["polite"]))
        assert reply.status_code == 200


async def test_admin_routes_need_an_admin_key(keyed):
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url) as http:
        for path in ("/metrics", "/dashboard/state.json"):
            assert (await http.get(path)).status_code == 401
            assert (await http.get(path, headers=bearer(keys["polite"]))).status_code == 403
            assert (await http.get(path, headers=bearer(keys["ops"]))).status_code == 200
        # Probes and the static page stay open: they reveal nothing.
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/ready")).status_code == 200
        assert b"<table" in (await http.get("/dashboard")).content


async def test_abusive_key_is_limited_polite_key_is_not(keyed):
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        async def call(key: str) -> httpx.Response:
            return await http.post("/v1/chat/completions", json=GOOD, headers=bearer(key))

        replies = await asyncio.gather(*(call(keys["abusive"] if i % 2 else keys["polite"]) for i in range(40)))
        abusive = [r for i, r in enumerate(replies) if i % 2]
        polite = [r for i, r in enumerate(replies) if not i % 2]
        assert all(r.status_code == 200 for r in polite)
        limited = [r for r in abusive if r.status_code == 429]
        assert len(limited) >= 10  # 5 per minute allowed
        assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
        assert limited[0].json()["error"]["type"] == "rate_limit_error"
        assert (await call(keys["polite"])).status_code == 200
        metrics = (await http.get("/metrics", headers=bearer(keys["ops"]))).text
        assert 'vllm_fleet_gateway_rejections_total{reason="rate_limited"}' in metrics


def test_public_bind_without_keys_is_refused():
    with pytest.raises(ValueError, match="without API keys"):
        GatewayConfig(host="0.0.0.0")
    GatewayConfig(host="0.0.0.0", api_key_file="/some/keys.jsonl")


def test_cli_refuses_public_bind_without_keys(capsys):
    from vllm_fleet.cli import main

    assert main(["gateway", "--workers", "127.0.0.1:1", "--host", "0.0.0.0"]) == 2
    assert "--api-key-file" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        from vllm_fleet.config import validated
        validated(GatewayConfig, {"host": "0.0.0.0"})


async def test_access_log_names_the_key_id_never_the_key(keyed, caplog):
    server, keys = keyed
    caplog.set_level("INFO", logger="vllm_fleet.gateway.access")
    async with httpx.AsyncClient(base_url=server.url) as http:
        reply = await http.post("/v1/chat/completions", json=GOOD,
                                headers={**bearer(keys["polite"]), "x-request-id": "audit-1"})
        assert reply.status_code == 200
    entries = [r for r in caplog.records if getattr(r, "request_id", None) == "audit-1"]
    assert len(entries) == 1
    entry = entries[0]
    assert (entry.key_id, entry.status, entry.model, entry.completion_tokens) == ("polite", 200, MODEL_A, 2)
    assert entry.worker in {w.address for w in server.router.snapshot()}
    assert entry.ttft_ms is not None and entry.duration_ms >= entry.ttft_ms
    assert all(keys["polite"] not in r.getMessage() and keys["polite"] not in str(r.__dict__) for r in caplog.records)
