"""The pooling endpoints of `vllm serve`, at the gateway: embeddings, pooling, score, rerank, classify.

    POST /v1/embeddings                      vLLM's EmbeddingRequest (OpenAI's shape and vLLM's extras)
    POST /pooling                            vLLM's PoolingRequest
    POST /score, /v1/score                   vLLM's ScoreRequest
    POST /rerank, /v1/rerank, /v2/rerank     vLLM's RerankRequest (Jina/Cohere shape)
    POST /classify                           vLLM's ClassificationRequest

    body (413) → a JSON object with a string `model` or none (400) → router.pool (404 unknown
    model, 400 a model that does not serve this endpoint, 429, 503) → the worker runs vLLM's
    own serving code (400 naming the field vLLM refuses or would ignore) → vLLM's JSON answer.

The gateway forwards the body as the client sent it and the worker's answer as it came: the
meaning of every field is vLLM's, read once, on the worker (worker/pooling.py).
"""

from __future__ import annotations

import asyncio

from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.gateway.asgi import JSON_TYPE, Response
from vllm_fleet.gateway.call import Call, Route
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import json_object
from vllm_fleet.protocol.pooling import CLASSIFY, EMBEDDINGS, POOLING, RERANK, SCORE, PoolRequest
from vllm_fleet.router import Router

# Every path `vllm serve` 0.32 answers for each pooling endpoint.
POOLING_PATHS = {
    "/v1/embeddings": EMBEDDINGS,
    "/pooling": POOLING,
    "/score": SCORE,
    "/v1/score": SCORE,
    "/rerank": RERANK,
    "/v1/rerank": RERANK,
    "/v2/rerank": RERANK,
    "/classify": CLASSIFY,
}


class PoolingHandler:
    """Route handlers for the pooling paths; `routes()` is their part of the app's route table."""

    def __init__(self, router: Router, config: GatewayConfig) -> None:
        self.router = router
        self.config = config

    def routes(self) -> dict[tuple[str, str], Route]:
        return {("POST", path): Route("key", self._handler(endpoint)) for path, endpoint in POOLING_PATHS.items()}

    def _handler(self, endpoint: str):
        async def handle(call: Call) -> Response:
            return await self.handle(endpoint, call)
        return handle

    async def handle(self, endpoint: str, call: Call) -> Response:
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        model = _model_of(body)
        record.model = model
        loop = asyncio.get_running_loop()
        request = PoolRequest(request_id=call.worker_request_id, endpoint=endpoint, body_json=body)
        answer = await self.router.pool(request, model=model, key=call.key_id,
                                        deadline=loop.time() + self.config.request_timeout_s)
        record.worker = answer.worker
        record.attempts = answer.attempts
        record.prompt_tokens = answer.result.prompt_tokens
        return Response(200, answer.result.body_json, JSON_TYPE)


def _model_of(body: bytes) -> str | None:
    """The body's `model` (None when absent: a pool of one model answers), after checking the
    body is a JSON object; the rest of it is vLLM's to read, on the worker."""
    parsed = json_object(body or b"null")  # an empty body is no object either
    model = parsed.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model: must be a string", param="model", code="invalid_value")
    return model
