"""POST /v1/chat/completions and /v1/completions: translate, route, and shape the answer.

    body (413) → parse_body (400: HTTP shape, unknown or refused fields) → chat_plan / completion_plan (400: this
    gateway's limits, and the pre-routing context guard) → router.stream (404: unknown model,
    from the router's UnknownModelError) → first chunk (429/503/504, and 400 from the worker's
    exact engine checks) → 200, whole or streamed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from vllm_fleet.errors import MigrationUnsupportedError
from vllm_fleet.gateway import translate
from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.aggregate import Aggregate
from vllm_fleet.gateway.api_error import from_exception
from vllm_fleet.gateway.asgi import Response, StreamResponse
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.formats import UsageTally
from vllm_fleet.gateway.metrics import GatewayMetrics
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.sse import StreamEncoder, first_chunk
from vllm_fleet.gateway.translate import Plan
from vllm_fleet.router import RoutedStream, Router

logger = logging.getLogger(__name__)


class CompletionHandler:
    """Serves both generation endpoints: `chat` and `completion` are route handlers."""

    def __init__(self, router: Router, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.router = router
        self.config = config
        self.metrics = metrics

    async def chat(self, call: Call) -> Response | StreamResponse:
        return await self._handle("chat", call)

    async def completion(self, call: Call) -> Response | StreamResponse:
        return await self._handle("completion", call)

    async def _handle(self, kind: str, call: Call) -> Response | StreamResponse:
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        plan = self.plan(kind, body, record=record, worker_request_id=call.worker_request_id,
                         session_id=call.http.headers.get("x-session-id", ""))
        # vLLM's rule: the X-Request-Id header names the answer, else the body's request_id.
        named = plan.response_id if "x-request-id" not in call.http.headers else None
        response_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + (named or record.request_id)
        stream = self._open(plan, call.key_id)
        created = int(time.time())
        if plan.stream:
            return await self._streamed(plan, stream, record, response_id, created)
        return Response.json(await self._whole(plan, stream, record, response_id, created))

    def plan(self, kind: str, body: bytes, *, record: RequestRecord, worker_request_id: str,
             session_id: str = "") -> Plan:
        """Parse and check a request body (400s) into its Plan; fills in the record's model and stream."""
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        parsed = translate.parse_body(schema, body)
        record.model = parsed.model
        record.stream = bool(parsed.stream)
        # Only for the pre-routing context guard; whether the model is served is the router's
        # call (router.stream raises UnknownModelError → 404).
        info = self.router.model_info(parsed.model)
        build = translate.chat_plan if kind == "chat" else translate.completion_plan
        return build(parsed, request_id=worker_request_id, session_id=session_id, config=self.config,
                     max_model_len=info.max_model_len if info is not None else None)

    async def answer(self, plan: Plan, *, key: str | None, record: RequestRecord) -> dict:
        """The whole (non-streamed) answer's body, exactly what the online endpoint sends: the
        seam the batch runner (gateway/batch/) goes through, so a batch line is answered alike."""
        response_id = ("chatcmpl-" if plan.kind == "chat" else "cmpl-") + (plan.response_id or record.request_id)
        return await self._whole(plan, self._open(plan, key), record, response_id, int(time.time()))

    def _open(self, plan: Plan, key: str | None) -> RoutedStream:
        loop = asyncio.get_running_loop()
        return self.router.stream(plan.request, model=plan.model, key=key,
                                  deadline=loop.time() + self.config.request_timeout_s)

    async def _whole(self, plan: Plan, stream: RoutedStream, record: RequestRecord, response_id: str,
                     created: int) -> dict:
        try:
            return await self._aggregated(plan, stream, record, response_id, created)
        except MigrationUnsupportedError as exc:
            # Nothing of the answer reached the client yet, so it can start over, whole, once.
            logger.warning("restarting the answer from scratch: %s", exc, extra={"request_id": record.request_id})
            request = dataclasses.replace(plan.request, request_id=f"{plan.request.request_id}-again")
            again = self.router.stream(request, model=plan.model, key=stream.key, deadline=stream.deadline)
            return await self._aggregated(plan, again, record, response_id, created)

    async def _aggregated(self, plan: Plan, stream: RoutedStream, record: RequestRecord, response_id: str,
                          created: int) -> dict:
        aggregate = Aggregate(plan, response_id, created)
        try:
            async for chunk in stream:
                if record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - record.started
                aggregate.add(chunk)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, aggregate.usage)
        return aggregate.body()

    async def _streamed(self, plan: Plan, stream: RoutedStream, record: RequestRecord, response_id: str,
                        created: int) -> StreamResponse:
        encoder = StreamEncoder(plan, response_id, created)
        iterator = aiter(stream)
        first = await first_chunk(stream, iterator, lambda: self._settle(plan, stream, record, encoder.usage))
        return StreamResponse(self._events(plan, stream, iterator, first, encoder, record))

    async def _events(self, plan: Plan, stream: RoutedStream, iterator, first, encoder: StreamEncoder,
                      record: RequestRecord):
        itl = self.metrics.child(self.metrics.itl, plan.model)
        try:
            if first is not None:
                record.ttft_s = time.perf_counter() - record.started
                last = time.perf_counter()
                yield encoder.event(first)
                async for chunk in iterator:
                    now = time.perf_counter()
                    tokens = len(chunk.token_ids)
                    if tokens:
                        itl.observe((now - last) / tokens)
                    last = now
                    yield encoder.event(chunk)
            yield encoder.end()
        except Exception as exc:  # after the 200 went out, errors travel in the stream
            error = from_exception(exc)
            record.error = f"{error.status} {error.message}"
            if error.status >= 500:
                logger.warning("stream failed after its start: %s", exc, extra={"request_id": record.request_id})
            yield encoder.error(error)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, encoder.usage)

    def _settle(self, plan: Plan, stream: RoutedStream, record: RequestRecord, usage: UsageTally) -> None:
        self.metrics.settle(plan.model, stream, record, prompt_tokens=usage.prompt, completion_tokens=usage.completion)
