"""A bound on the size of a request's head (request line and headers): 431 above it.

uvicorn's httptools protocol has no such bound (llhttp sets none, and httptools buffers a
header until it ends), so a client could make the gateway hold megabytes per connection;
uvicorn's h11 protocol has one but answers it with a bare 400. `HeaderLimitProtocol` is the
httptools protocol with `max_header_bytes` counted as the head arrives:

- exactly, from the parser's callbacks: the URL, and each complete header (name, value and
  the 4 bytes of ": " and CRLF);
- coarsely, for a head still incomplete after a chunk was parsed: the whole chunk, when it
  holds nothing but that head (it continued the head, or it began it on an idle connection),
  so one endless header cannot grow without bound either.

Both counts are lower bounds of the real head size, so a head within the limit is never
refused. Over it, the request never reaches the app: the client gets 431 with an OpenAI error
body naming the limit and `--max-header-bytes`, the connection is closed after a short linger
(closing with unread input would reset it, and the client might never read the 431), and the
server goes on serving other connections.
"""

from __future__ import annotations

import functools
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from vllm_fleet.gateway.api_error import ApiError

logger = logging.getLogger(__name__)

# After the 431, how long unread input is drained before the socket closes.
LINGER_S = 2.0
HEADER_LINE_OVERHEAD = 4  # ": " and CRLF


def header_limit_protocol(max_header_bytes: int) -> functools.partial:
    """The protocol factory to give uvicorn.Config(http=...)."""
    return functools.partial(HeaderLimitProtocol, max_header_bytes=max_header_bytes)


def too_large_error(limit: int) -> ApiError:
    return ApiError(431, f"the request line and headers are larger than this gateway's limit of {limit} bytes "
                    "(--max-header-bytes); send fewer or smaller headers",
                    param="headers", code="request_header_fields_too_large")


class HeaderLimitProtocol(HttpToolsProtocol):
    def __init__(self, *args, max_header_bytes: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_header_bytes = max_header_bytes
        self._in_message = False  # between a request's first byte and its end
        self._in_head = False     # between a request's first byte and the end of its headers
        self._begun = 0           # requests begun on this connection
        self._head_exact = 0      # URL + complete headers of the head being parsed
        self._head_chunks = 0     # bytes of chunks that held only that head
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after the 431: drain and drop
        idle, in_head, begun = not self._in_message, self._in_head, self._begun
        super().data_received(data)
        # The chunk is all head if it continued the head, or began it on an idle connection
        # (a chunk that also held the end of an earlier request counts only exactly).
        if self._in_head and ((in_head and self._begun == begun) or (idle and self._begun == begun + 1)):
            self._head_chunks += len(data)
            self._check()
        if self._refused:
            self._send_431()

    # Parser callbacks: count, and once refused, keep the rest of this request from the app.

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._begun += 1
        self._head_exact = self._head_chunks = 0
        if not self._refused:
            super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_exact += len(url)
        if self._check():
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_exact += len(name) + len(value) + HEADER_LINE_OVERHEAD
        if self._check():
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if not self._refused:
            super().on_message_complete()

    def _check(self) -> bool:
        """Whether the head is still within the limit; marks the connection refused if not."""
        if not self._refused and max(self._head_exact, self._head_chunks) > self.max_header_bytes:
            self._refused = True
        return not self._refused

    def _send_431(self) -> None:
        if self.transport.is_closing():
            return
        client = "%s:%d" % self.client if self.client else "unknown client"
        logger.warning("refused a request from %s: its head is over --max-header-bytes %d (431)",
                       client, self.max_header_bytes)
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request behind one still answering: a 431 now would land inside that
            # response's bytes, so the connection just closes.
            self.transport.close()
            return
        error = too_large_error(self.max_header_bytes)
        body = error.body_bytes()
        head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n", b"\r\n"]
        self.transport.write(b"".join(head) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client sees the end of the answer; we keep reading
        self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()
