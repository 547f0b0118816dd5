"""POST /v1/chat/completions and /v1/completions: translate, route, and shape the answer.

    body (413) → parse_body (400: HTTP shape, unknown or refused fields) → chat_plan / completion_plan (400: this
    gateway's limits, and the pre-routing context guard) → router.stream (404: unknown model,
    from the router's UnknownModelError) → first chunk (429/503/504, and 400 from the worker's
    exact engine checks) → 200, whole or streamed.
"""

from __future__ import annotations

import time

from vllm_fleet.gateway import translate
from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.aggregate import Aggregate
from vllm_fleet.gateway.asgi import Response, StreamResponse
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.front_door import FrontDoor, answer_name
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.sse import StreamEncoder
from vllm_fleet.gateway.translate import Plan


class CompletionHandler:
    """Serves both generation endpoints: `chat` and `completion` are route handlers. Opening,
    streaming and settling are the front door's (front_door.py); the mapping is translate.py's
    (body → Plan), sse.py's (chunk → event) and aggregate.py's (chunks → body)."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.router = door.router
        self.config = door.config

    async def chat(self, call: Call) -> Response | StreamResponse:
        return await self._handle("chat", call)

    async def completion(self, call: Call) -> Response | StreamResponse:
        return await self._handle("completion", call)

    async def _handle(self, kind: str, call: Call) -> Response | StreamResponse:
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        plan = self.plan(kind, body, record=record, worker_request_id=call.worker_request_id,
                         session_id=call.http.headers.get("x-session-id", ""))
        response_id = _prefix(kind) + answer_name(plan.response_id, call.http.headers, record.request_id)
        created = int(time.time())
        if plan.stream:
            return await self.door.streamed(plan.request, plan.model, key=call.key_id, record=record,
                                            writer=StreamEncoder(plan, response_id, created), observe_itl=True)
        return Response.json(await self._whole(plan, call.key_id, record, response_id, created))

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
        response_id = _prefix(plan.kind) + (plan.response_id or record.request_id)
        return await self._whole(plan, key, record, response_id, int(time.time()))

    async def _whole(self, plan: Plan, key: str | None, record: RequestRecord, response_id: str,
                     created: int) -> dict:
        return await self.door.whole(plan.request, plan.model, key=key, record=record,
                                     answer=lambda: Aggregate(plan, response_id, created))


def _prefix(kind: str) -> str:
    return "chatcmpl-" if kind == "chat" else "cmpl-"
