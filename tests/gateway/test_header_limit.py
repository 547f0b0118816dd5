"""--max-header-bytes: a request whose head (request line + headers) is over the limit gets a
real 431 with an OpenAI error body naming the limit and the option; the gateway keeps serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl

import httpx
import pytest

from gateway_support import MODEL_A
from test_tls import certificate  # noqa: F401 (the fixture: a self-signed certificate)

pytestmark = pytest.mark.timeout(60)

KIB = 1024


@pytest.fixture
async def server(start_gateway, mock_fleet):
    return await start_gateway([w.address for w in mock_fleet["a"]])


async def raw_exchange(url: str, head: bytes, *, piece: int | None = None) -> tuple[int, dict, bytes]:
    """Send `head` on a fresh connection (all at once, or in `piece`-byte writes) and read the
    answer to the end: (status, headers, body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for start in range(0, len(head), piece or len(head)):
            writer.write(head[start:start + (piece or len(head))])
            try:
                await writer.drain()
            except ConnectionError:  # the server answered and stopped reading: read its answer
                break
        status_line = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        return int(status_line.split()[1]), headers, body
    finally:
        writer.close()


def oversized_head(value_bytes: int, path: str = "/health") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: test\r\nX-Big: {'v' * value_bytes}\r\n\r\n").encode()


async def assert_still_serving(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200
        body = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text


async def test_one_20k_header_gets_431_naming_the_limit_and_the_next_request_works(server):
    status, headers, body = await raw_exchange(server.url, oversized_head(20 * KIB))
    assert status == 431
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "request_header_fields_too_large"
    assert error["type"] == "invalid_request_error"
    assert "16384 bytes" in error["message"] and "--max-header-bytes" in error["message"]
    await assert_still_serving(server.url)


async def test_many_small_headers_over_the_total_get_431_from_httpx(server):
    headers = {f"x-h{i}": "v" * 100 for i in range(200)}  # ~21 KiB in all, no single header large
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        reply = await http.get("/v1/models", headers=headers)
        assert reply.status_code == 431
        assert reply.json()["error"]["code"] == "request_header_fields_too_large"
    await assert_still_serving(server.url)


async def test_a_head_that_never_ends_is_cut_off_at_the_limit(server):
    # 20 KiB of one header, in 1 KiB writes, and then nothing: the header never ends, yet the
    # gateway answers 431 (so one endless header cannot fill its memory).
    unfinished = oversized_head(20 * KIB)[:-4]
    status, _, body = await asyncio.wait_for(raw_exchange(server.url, unfinished, piece=KIB), 20)
    assert status == 431
    assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
    await assert_still_serving(server.url)


async def test_a_1mib_header_in_small_writes_gets_431(server):
    # The answer may come while the client still sends; the client reads it all the same.
    status, _, _ = await raw_exchange(server.url, oversized_head(1024 * KIB), piece=KIB)
    assert status == 431
    await assert_still_serving(server.url)


async def test_a_long_url_counts_toward_the_limit(server):
    status, _, _ = await raw_exchange(server.url, f"GET /health?{'q' * 20 * KIB} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert status == 431


async def test_a_body_over_the_head_limit_is_fine(server):
    # The limit is on the head only: a 64 KiB prompt in the body is served.
    body = {"model": MODEL_A, "messages": [{"role": "user", "content": "word " * (13 * KIB)}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code != 431, reply.text


async def test_headers_within_the_limit_pass(server):
    status, _, body = await raw_exchange(server.url, oversized_head(12 * KIB))
    assert status == 200, body


async def test_oversized_head_after_a_good_request_on_the_same_connection(server):
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        while await reader.readline() not in (b"\r\n", b""):
            pass
        await reader.readexactly(len(b'{"status": "ok"}'))
        writer.write(oversized_head(20 * KIB))
        assert (await reader.readline()).startswith(b"HTTP/1.1 431")
    finally:
        writer.close()
    await assert_still_serving(server.url)


async def test_the_limit_is_an_option(start_gateway, mock_fleet):
    server = await start_gateway([w.address for w in mock_fleet["a"]], max_header_bytes=4 * KIB)
    status, _, body = await raw_exchange(server.url, oversized_head(6 * KIB))
    assert status == 431
    assert "4096 bytes" in json.loads(body)["error"]["message"]
    status, _, _ = await raw_exchange(server.url, oversized_head(2 * KIB))
    assert status == 200


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a test certificate")
async def test_431_over_tls(start_gateway, mock_fleet, certificate):
    cert, key = certificate
    server = await start_gateway([w.address for w in mock_fleet["a"]], tls_cert=cert, tls_key=key)
    async with httpx.AsyncClient(base_url=server.url, verify=ssl.create_default_context(cafile=cert)) as http:
        reply = await http.get("/health", headers={"x-big": "v" * 20 * KIB})
        assert reply.status_code == 431
        assert reply.json()["error"]["code"] == "request_header_fields_too_large"
        assert (await http.get("/health")).status_code == 200
