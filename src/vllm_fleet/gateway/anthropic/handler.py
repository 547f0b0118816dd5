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

from vllm_fleet.gateway.anthropic import request as anthropic_request
from vllm_fleet.gateway.anthropic.answer import WholeMessage, message_id
from vllm_fleet.gateway.anthropic.events import AnthropicEvents
from vllm_fleet.gateway.asgi import Response, StreamResponse
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.formats import UsageTally
from vllm_fleet.gateway.front_door import FrontDoor


class AnthropicHandler:
    """The Messages door's mapping: request.py (body → plan), events.py (chunk → events) and
    answer.py (chunks → message); the front door (front_door.py) opens, streams and settles."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.router = door.router
        self.config = door.config

    async def create(self, call: Call) -> Response | StreamResponse:
        """POST /v1/messages."""
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        parsed, raw = anthropic_request.parse(body)
        record.model = parsed.model
        record.stream = bool(parsed.stream)
        info = self.router.model_info(parsed.model)
        plan = anthropic_request.plan(parsed, raw, request_id=call.worker_request_id,
                                      session_id=call.http.headers.get("x-session-id", ""), config=self.config,
                                      max_model_len=info.max_model_len if info is not None else None)
        response_id = message_id(record.request_id)
        if plan.stream:
            return await self.door.streamed(plan.request, plan.model, key=call.key_id, record=record,
                                            writer=AnthropicEvents(response_id, plan.model, plan.stop_sequences))
        message = await self.door.whole(plan.request, plan.model, key=call.key_id, record=record,
                                        answer=lambda: WholeMessage(response_id, plan.model, plan.stop_sequences))
        return Response.json(message)

    async def count_tokens(self, call: Call) -> Response:
        """POST /v1/messages/count_tokens: the prompt's tokens as a worker renders it. The worker
        protocol has no render-only call, so the worker runs the request for one token; its prefill
        also leaves the prompt in that worker's prefix cache for the request that usually follows."""
        record = call.record
        body = await call.http.read_body(self.config.max_body_bytes)
        parsed, raw = anthropic_request.parse(body, anthropic_request.CountTokensRequest,
                                              anthropic_request.COUNT_FIELDS)
        record.model = parsed.model
        info = self.router.model_info(parsed.model)
        request = anthropic_request.count_request(
            parsed, raw, request_id=call.worker_request_id, session_id=call.http.headers.get("x-session-id", ""),
            config=self.config, max_model_len=info.max_model_len if info is not None else None)
        usage = UsageTally()
        stream = self.door.open(request, parsed.model, call.key_id)
        try:
            async for chunk in stream:
                usage.add(chunk)
        finally:
            await stream.aclose()
            self.door.settle(parsed.model, stream, record, usage)
        tokens = usage.prompt
        # vLLM's answer: the count, and the same count as context_management's original count.
        return Response.json({"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}})
