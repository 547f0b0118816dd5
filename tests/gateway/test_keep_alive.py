"""--http-keep-alive-s: how long the gateway keeps an idle client connection. A server that closes
before its clients' own idle timeout (httpx's 5 s, an ALB's 60 s) races a request being sent on
that connection, which then fails: an online request lost for nothing (seen in a bench on
2026-12-05 as an httpx ReadError at uvicorn's default of 5 s)."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.gateway.config import GatewayConfig

pytestmark = pytest.mark.timeout(60)


async def idle_close_after_response(url: str, deadline_s: float) -> bytes:
    """One keep-alive request, then what the connection gives within `deadline_s` of idling (b"": closed)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        await writer.drain()
        headers = {}
        assert (await reader.readline()).split()[1] == b"200"
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        await reader.readexactly(int(headers.get("content-length", 0)))
        return await asyncio.wait_for(reader.read(), timeout=deadline_s)
    finally:
        writer.close()


async def test_an_idle_connection_is_closed_when_the_set_keep_alive_ends(start_gateway, mock_fleet):
    server = await start_gateway([w.address for w in mock_fleet["a"]], http_keep_alive_s=1)
    # Closed by the server after ~1 s idle; uvicorn's own 5 s would pass this deadline.
    assert await idle_close_after_response(server.url, deadline_s=4) == b""


def test_the_default_outlasts_the_idle_timeouts_of_common_clients_and_load_balancers():
    assert GatewayConfig().http_keep_alive_s > 60  # an ALB's 60 s, httpx's and OpenAI's SDKs' 5 s
