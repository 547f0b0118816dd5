"""The one skeleton of every generating front door: chat/completions, Responses, Anthropic Messages.

A door maps; this module runs. What each door keeps is its own mapping:

    request → GenerateRequest   (its parse and checks: 400s in its error shape, app.py)
    chunk   → its SSE bytes     (a StreamWriter: sse.StreamEncoder, ResponsesOutput, anthropic AnthropicEvents)
    chunks  → its whole body    (a WholeAnswer: aggregate.Aggregate, ResponsesOutput, anthropic WholeMessage)
    error   → its error event   (StreamWriter.error; before the 200 an error is app.py's to shape)

What every door shares is here, written once:

    open      router.stream with the request's deadline (404 unknown model raised right away)
    whole     collect the chunks; a stream that cannot migrate exactly (MigrationUnsupportedError)
              starts over once, whole: nothing of it reached the client yet
    streamed  the first chunk is read before the 200 goes out, so that admission and routing
              failures keep their HTTP status (429, 503, 404); then the writer's bytes, one write per
              chunk; an error after the 200 becomes the writer's error event
    settle    usage, TTFT and the access log's worker fields, once, however the answer ends: a client
              that disconnects cancels the handler task (asgi.until_disconnect) or closes the event
              generator, and the stream's `aclose` in `finally` aborts the worker request

The streamed path is the data path (issue #49): the events generator is the only layer between
the RoutedStream and the ASGI send, as each door's own generator was before; the writer's
`event` returns the chunk's bytes in one piece. The inter-token latency histogram is observed
where it was before, on the OpenAI doors (`observe_itl`): its observe costs about 0.9 us a chunk,
as much as a third of the door's own work, so a door without it streams in the plain loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from vllm_fleet.errors import MigrationUnsupportedError
from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.api_error import ApiError, from_exception
from vllm_fleet.gateway.asgi import StreamResponse
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.metrics import GatewayMetrics
from vllm_fleet.protocol.types import Chunk, GenerateRequest
from vllm_fleet.router import RoutedStream, Router

logger = logging.getLogger(__name__)


class Usage(Protocol):
    """Token counts of one answer, as the door counts them (formats.UsageTally, or its own)."""

    @property
    def prompt(self) -> int: ...

    @property
    def completion(self) -> int: ...


class StreamWriter(Protocol):
    """One streamed answer in a door's event format. One instance per request."""

    usage: Usage

    def start(self) -> bytes:
        """What goes before the first chunk's events (b"" where the format has nothing)."""

    def event(self, chunk: Chunk) -> bytes:
        """The chunk's events, in one piece (b"" when it has none)."""

    def end(self) -> bytes:
        """The events that end a stream that finished."""

    def error(self, error: ApiError) -> bytes:
        """The events that end a stream that failed after its 200."""


class WholeAnswer(Protocol):
    """One whole (non-streamed) answer in a door's body format. One instance per attempt."""

    usage: Usage

    def add(self, chunk: Chunk) -> None: ...

    def body(self) -> dict: ...


class FrontDoor:
    """Opens, streams or collects, and settles the routed stream of one generating request."""

    def __init__(self, router: Router, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.router = router
        self.config = config
        self.metrics = metrics

    def open(self, request: GenerateRequest, model: str, key: str | None) -> RoutedStream:
        loop = asyncio.get_running_loop()
        return self.router.stream(request, model=model, key=key, deadline=loop.time() + self.config.request_timeout_s)

    async def whole(self, request: GenerateRequest, model: str, *, key: str | None, record: RequestRecord,
                    answer: Callable[[], WholeAnswer]) -> dict:
        """The door's whole body; `answer()` makes a fresh, empty one (a second for a restart)."""
        stream = self.open(request, model, key)
        try:
            return await self._collect(stream, answer(), model, record)
        except MigrationUnsupportedError as exc:
            # Nothing of the answer reached the client yet, so it can start over, whole, once.
            logger.warning("restarting the answer from scratch: %s", exc, extra={"request_id": record.request_id})
            again = dataclasses.replace(request, request_id=f"{request.request_id}-again")
            stream = self.router.stream(again, model=model, key=stream.key, deadline=stream.deadline)
            return await self._collect(stream, answer(), model, record)

    async def _collect(self, stream: RoutedStream, answer: WholeAnswer, model: str, record: RequestRecord) -> dict:
        try:
            async for chunk in stream:
                if record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - record.started
                answer.add(chunk)
        finally:
            await stream.aclose()
            self.settle(model, stream, record, answer.usage)
        return answer.body()

    async def streamed(self, request: GenerateRequest, model: str, *, key: str | None, record: RequestRecord,
                       writer: StreamWriter, observe_itl: bool = False) -> StreamResponse:
        """The 200 and the door's events, once the first chunk came (or the stream ended at once);
        `observe_itl`: time the gaps between chunks into the inter-token latency histogram."""
        stream = self.open(request, model, key)
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await stream.aclose()
            self.settle(model, stream, record, writer.usage)
            raise
        itl = self.metrics.child(self.metrics.itl, model) if observe_itl else None
        return StreamResponse(self._events(stream, first, writer, itl, model, record))

    async def _events(self, stream: RoutedStream, first: Chunk | None, writer: StreamWriter, itl, model: str,
                      record: RequestRecord):
        try:
            if first is not None:
                record.ttft_s = time.perf_counter() - record.started
                event = writer.event
                last = time.perf_counter()
                yield writer.start() + event(first)
                if itl is None:
                    async for chunk in stream:
                        yield event(chunk)
                else:
                    async for chunk in stream:
                        now = time.perf_counter()
                        tokens = len(chunk.token_ids)
                        if tokens:
                            itl.observe((now - last) / tokens)
                        last = now
                        yield event(chunk)
                yield writer.end()
            else:
                yield writer.start() + writer.end()
        except Exception as exc:  # after the 200 went out, errors travel in the stream
            error = from_exception(exc)
            record.error = f"{error.status} {error.message}"
            if error.status >= 500:
                logger.warning("stream failed after its start: %s", exc, extra={"request_id": record.request_id})
            yield writer.error(error)
        finally:
            await stream.aclose()
            self.settle(model, stream, record, writer.usage)

    def settle(self, model: str, stream: RoutedStream, record: RequestRecord, usage: Usage) -> None:
        self.metrics.settle(model, stream, record, prompt_tokens=usage.prompt, completion_tokens=usage.completion)


def answer_name(requested: str | None, headers: dict[str, str], request_id: str) -> str:
    """What names the answer (after its prefix), by vLLM's rule: the X-Request-Id header when the
    client sent one (the request id is then the header's), else the body's request_id, else ours."""
    return (requested if "x-request-id" not in headers else None) or request_id
