"""POST /v1/messages: parse, route, and shape the fleet's chunks as Anthropic's message or events.

    body (413) → request.parse (400: shape, unknown or refused fields, images) → request.plan (400:
    limits, context guard) → router.stream (404 unknown model) → first chunk (429/529/504, and 400
    from the worker: vLLM's Anthropic model and conversion) → 200, whole or streamed.

The stream goes through the router like a chat stream: failover before the first token, migration
after it (the worker re-converts the same body and continues after the tokens already sent). A
constrained stream (a forced tool, an output format) cannot continue elsewhere: a whole answer
starts over once, a streamed one ends with an error event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from vllm_fleet.errors import MigrationUnsupportedError
from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.anthropic import request as messages_request
from vllm_fleet.gateway.anthropic.answer import WholeMessage, message_id
from vllm_fleet.gateway.anthropic.events import MessageEvents
from vllm_fleet.gateway.anthropic.request import MessagesPlan
from vllm_fleet.gateway.api_error import from_exception
from vllm_fleet.gateway.asgi import Response, StreamResponse
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.formats import UsageTally
from vllm_fleet.gateway.metrics import GatewayMetrics
from vllm_fleet.gateway.sse import first_chunk
from vllm_fleet.router import RoutedStream, Router

logger = logging.getLogger(__name__)


class MessagesHandler:
    def __init__(self, router: Router, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.router = router
        self.config = config
        self.metrics = metrics

    async def messages(self, call: Call) -> Response | StreamResponse:
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        parsed, raw = messages_request.parse(body)
        record.model = parsed.model
        record.stream = bool(parsed.stream)
        info = self.router.model_info(parsed.model)
        plan = messages_request.plan(parsed, raw, request_id=call.worker_request_id,
                                     session_id=call.http.headers.get("x-session-id", ""), config=self.config,
                                     max_model_len=info.max_model_len if info is not None else None)
        response_id = message_id(record.request_id)
        stream = self._open(plan, call.key_id)
        if plan.stream:
            return await self._streamed(plan, stream, record, response_id)
        return Response.json(await self._whole(plan, stream, record, response_id))

    async def count_tokens(self, call: Call) -> Response:
        """POST /v1/messages/count_tokens: the prompt's tokens as a worker renders it. The worker
        protocol has no render-only call, so the worker runs the request for one token; its prefill
        also leaves the prompt in that worker's prefix cache for the request that usually follows."""
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        parsed, raw = messages_request.parse(body, messages_request.CountTokensRequest, messages_request.COUNT_FIELDS)
        record.model = parsed.model
        info = self.router.model_info(parsed.model)
        request = messages_request.count_request(
            parsed, raw, request_id=call.worker_request_id, session_id=call.http.headers.get("x-session-id", ""),
            config=self.config, max_model_len=info.max_model_len if info is not None else None)
        plan = MessagesPlan(request=request, model=parsed.model, stream=False, stop_sequences=())
        message = WholeMessage("", parsed.model, ())
        stream = self._open(plan, call.key_id)
        try:
            async for chunk in stream:
                message.usage.add(chunk)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, message.usage)
        tokens = message.usage.prompt
        # vLLM's answer: the count, and the same count as context_management's original count.
        return Response.json({"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}})

    def _open(self, plan: MessagesPlan, key: str | None) -> RoutedStream:
        loop = asyncio.get_running_loop()
        return self.router.stream(plan.request, model=plan.model, key=key,
                                  deadline=loop.time() + self.config.request_timeout_s)

    async def _whole(self, plan: MessagesPlan, stream: RoutedStream, record: RequestRecord, response_id: str) -> dict:
        try:
            return await self._gathered(plan, stream, record, response_id)
        except MigrationUnsupportedError as exc:
            # Nothing reached the client yet, so the answer can start over, whole, once.
            logger.warning("restarting the answer from scratch: %s", exc, extra={"request_id": record.request_id})
            request = dataclasses.replace(plan.request, request_id=f"{plan.request.request_id}-again")
            again = self.router.stream(request, model=plan.model, key=stream.key, deadline=stream.deadline)
            return await self._gathered(plan, again, record, response_id)

    async def _gathered(self, plan: MessagesPlan, stream: RoutedStream, record: RequestRecord,
                        response_id: str) -> dict:
        message = WholeMessage(response_id, plan.model, plan.stop_sequences)
        try:
            async for chunk in stream:
                if record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - record.started
                message.add(chunk)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, message.usage)
        return message.body()

    async def _streamed(self, plan: MessagesPlan, stream: RoutedStream, record: RequestRecord,
                        response_id: str) -> StreamResponse:
        events = MessageEvents(response_id, plan.model, plan.stop_sequences)
        iterator = aiter(stream)
        first = await first_chunk(stream, iterator, lambda: self._settle(plan, stream, record, events.usage))
        return StreamResponse(self._events(plan, stream, iterator, first, events, record))

    async def _events(self, plan: MessagesPlan, stream: RoutedStream, iterator, first, events: MessageEvents,
                      record: RequestRecord):
        try:
            record.ttft_s = time.perf_counter() - record.started
            yield events.start()
            if first is not None:
                yield events.event(first)
                async for chunk in iterator:
                    yield events.event(chunk)
            yield events.end()
        except Exception as exc:  # after the 200 went out, errors travel in the stream
            error = from_exception(exc)
            record.error = f"{error.status} {error.message}"
            if error.status >= 500:
                logger.warning("stream failed after its start: %s", exc, extra={"request_id": record.request_id})
            yield events.error(error)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, events.usage)

    def _settle(self, plan: MessagesPlan, stream: RoutedStream, record: RequestRecord, usage: UsageTally) -> None:
        self.metrics.settle(plan.model, stream, record, prompt_tokens=usage.prompt, completion_tokens=usage.completion)
