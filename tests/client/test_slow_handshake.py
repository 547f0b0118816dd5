"""A worker slow to answer the HTTP/2 handshake (a loaded host: the suite saw one take longer than
200 ms beside a starting JVM and engines) must still be reached: one connection attempt may take
`ClientOptions.min_connect_timeout_ms` (5 s), which gRPC reads from `grpc.min_reconnect_backoff_ms`."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol import GenerateInput, build_request

HANDSHAKE_DELAY_S = 0.8


@contextlib.asynccontextmanager
async def _slow_to_answer(upstream: str, delay_s: float):
    """A TCP relay to `upstream` that holds the server's first bytes (its SETTINGS frame) for `delay_s`."""
    host, port = upstream.rsplit(":", 1)

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        first = True
        try:
            while data := await reader.read(65536):
                if first and delay:
                    await asyncio.sleep(delay)
                first = False
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    tasks: list[asyncio.Task] = []

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        tasks.extend([asyncio.create_task(pump(client_reader, server_writer, 0.0)),
                      asyncio.create_task(pump(server_reader, client_writer, delay_s))])

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _answer(address: str, options: ClientOptions) -> str:
    client = WorkerClient(address, options)
    try:
        request = build_request("slow-handshake", [GenerateInput(text="hi")])
        return "".join([chunk.text async for chunk in client.generate(request, timeout=30)])
    finally:
        await client.close()


async def test_a_worker_slow_to_finish_the_handshake_is_still_reached(scripted):
    async with _slow_to_answer(scripted.address, HANDSHAKE_DELAY_S) as slow:
        assert await _answer(slow, ClientOptions(multiplex=False)) == "ok"


async def test_with_a_connect_timeout_shorter_than_the_handshake_the_call_fails(scripted):
    # What the client did when its connect timeout was the 200 ms reconnect backoff.
    async with _slow_to_answer(scripted.address, HANDSHAKE_DELAY_S) as slow:
        with pytest.raises(WorkerUnavailableError):
            await _answer(slow, ClientOptions(multiplex=False, min_connect_timeout_ms=200))
