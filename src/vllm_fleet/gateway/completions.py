"""POST /v1/chat/completions and /v1/completions: validate, route, and shape the answer."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from vllm_fleet.gateway import translate
from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.aggregate import Aggregate
from vllm_fleet.gateway.api_error import ApiError, from_exception
from vllm_fleet.gateway.asgi import HttpRequest, Response, StreamResponse
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.metrics import GatewayMetrics
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.sse import StreamEncoder

logger = logging.getLogger(__name__)


class CompletionHandler:
    """Serves both generation endpoints; `kind` is "chat" or "completion"."""

    def __init__(self, router, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.router = router
        self.config = config
        self.metrics = metrics

    async def handle(self, kind: str, http: HttpRequest, record: RequestRecord, worker_request_id: str):
        body = await http.read_body(self.config.max_body_bytes)
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        parsed = translate.parse_body(schema, body)
        record.model = parsed.model
        record.stream = bool(parsed.stream)
        info = self.router.model_info(parsed.model)
        if info is None:
            known = ", ".join(self.router.models()) or "none are serving now"
            raise ApiError(404, f"model {parsed.model!r} is not served here; models: {known}",
                           param="model", code="model_not_found")
        build = translate.chat_plan if kind == "chat" else translate.completion_plan
        session_id = http.headers.get("x-session-id", "")
        plan = build(parsed, request_id=worker_request_id, session_id=session_id, config=self.config,
                     max_model_len=info.max_model_len)
        loop = asyncio.get_running_loop()
        stream = self.router.stream(plan.request, model=plan.model, key=record.key_id,
                                    deadline=loop.time() + self.config.request_timeout_s)
        response_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + record.request_id
        created = int(time.time())
        if plan.stream:
            return await self._streamed(plan, stream, record, response_id, created)
        return await self._whole(plan, stream, record, response_id, created)

    async def _whole(self, plan, stream, record: RequestRecord, response_id: str, created: int) -> Response:
        aggregate = Aggregate(plan, response_id, created)
        try:
            async for chunk in stream:
                if record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - record.started
                aggregate.add(chunk)
        finally:
            await stream.aclose()
            self._settle(plan, stream, record, aggregate.usage)
        return Response.json(aggregate.body())

    async def _streamed(self, plan, stream, record: RequestRecord, response_id: str, created: int) -> StreamResponse:
        encoder = StreamEncoder(plan, response_id, created)
        iterator = aiter(stream)
        try:
            # Wait for the first chunk before answering 200, so that admission and routing
            # failures still get their real status (429, 503, 404) rather than an SSE error.
            first = await anext(iterator)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await stream.aclose()
            self._settle(plan, stream, record, encoder.usage)
            raise
        return StreamResponse(self._events(plan, stream, iterator, first, encoder, record))

    async def _events(self, plan, stream, iterator, first, encoder: StreamEncoder, record: RequestRecord):
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

    def _settle(self, plan, stream, record: RequestRecord, usage) -> None:
        record.worker = getattr(stream, "worker", None)
        record.attempts = getattr(stream, "attempts", 0)
        record.migrations = getattr(stream, "migrations", 0)
        record.prompt_tokens = usage.prompt
        record.completion_tokens = usage.completion
        metrics = self.metrics
        if usage.prompt:
            metrics.child(metrics.tokens, plan.model, "prompt").inc(usage.prompt)
        if usage.completion:
            metrics.child(metrics.tokens, plan.model, "completion").inc(usage.completion)
        if record.ttft_s is not None:
            metrics.child(metrics.ttft, plan.model).observe(record.ttft_s)


def worker_request_id(request_id: str, from_client: bool) -> str:
    """Ids from clients may repeat; the worker needs a unique one to abort the right request."""
    return f"{request_id}-{secrets.token_hex(4)}" if from_client else request_id
