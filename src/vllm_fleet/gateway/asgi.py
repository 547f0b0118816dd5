"""The thin HTTP layer: requests, responses and streaming over raw ASGI.

We speak ASGI directly instead of through a framework: the gateway has a dozen routes, and on
the streaming path every microsecond per event counts. What a framework would give us and we
need is here: bounded body reading (413), JSON/bytes responses, and SSE that stops — and lets
the handler abort the worker request — as soon as the client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.formats import DONE

Headers = list[tuple[bytes, bytes]]
JSON_TYPE = b"application/json"
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # Tell nginx-style proxies not to buffer the stream.
    (b"x-accel-buffering", b"no"),
]


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    client: str
    receive: Callable[[], Awaitable[dict]]
    body: bytes = b""
    # Set once the body is read: only then may the disconnect watcher call receive(), or it
    # would take body messages from under read_body().
    body_read: asyncio.Event = field(default_factory=asyncio.Event)
    query: str = ""  # the raw query string (only the Batch API's list routes read one)

    @classmethod
    def from_scope(cls, scope: dict, receive) -> HttpRequest:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        return cls(scope["method"], scope["path"], headers, f"{client[0]}:{client[1]}" if client else "", receive,
                   query=scope.get("query_string", b"").decode("latin-1"))

    async def read_body(self, limit: int) -> bytes:
        """The whole body; 413 as soon as it is known to exceed `limit` bytes."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        self.body = b"".join(parts)
        self.body_read.set()
        return self.body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than this gateway's limit of {limit} bytes",
                    code="request_too_large")


class ClientGone(Exception):
    """The client closed the connection."""


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: bytes = JSON_TYPE
    headers: Headers = field(default_factory=list)

    @classmethod
    def json(cls, data, status: int = 200, headers: Headers | None = None) -> Response:
        return cls(status, json.dumps(data, ensure_ascii=False).encode(), JSON_TYPE, headers or [])

    @classmethod
    def error(cls, error: ApiError) -> Response:
        return cls(error.status, error.body_bytes(), JSON_TYPE, error.headers())

    async def send(self, send, extra: Headers) -> None:
        headers = [(b"content-type", self.content_type), (b"content-length", str(len(self.body)).encode()),
                   *self.headers, *extra]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


@dataclass(slots=True)
class StreamResponse:
    """Server-sent events from `events`; the iterator's cleanup runs however the stream ends."""

    events: AsyncIterator[bytes]
    status: int = 200

    async def send(self, send, extra: Headers) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": [*SSE_HEADERS, *extra]})
        try:
            async for event in self.events:
                if event.endswith(DONE):
                    # The last event ends the body in the same write (one syscall less per stream).
                    await send({"type": "http.response.body", "body": event})
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await self.events.aclose()


async def until_disconnect(http: HttpRequest, work: Awaitable) -> object:
    """Run `work` in this task; if the client disconnects first, cancel it and raise ClientGone.

    Cancelling the handler is what makes a gone client abort its worker request: the handler's
    `finally` closes the router stream, which cancels the gRPC call. The work runs in the
    caller's task and one watcher task cancels it: one task per request, not two.
    """
    current = asyncio.current_task()
    gone = finished = False

    def on_disconnect(_: asyncio.Future) -> None:
        nonlocal gone
        # `finished`: a callback already scheduled when the work returned must not cancel what
        # this task does next.
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            current.cancel()

    watcher = asyncio.ensure_future(_wait_disconnect(http))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        # Ours (the client left) unless someone else cancelled this task too (server shutdown).
        if gone and current.uncancel() == 0:
            raise ClientGone() from None
        raise
    finally:
        finished = True
        watcher.cancel()


async def _wait_disconnect(http: HttpRequest) -> None:
    await http.body_read.wait()
    while (await http.receive())["type"] != "http.disconnect":
        pass
