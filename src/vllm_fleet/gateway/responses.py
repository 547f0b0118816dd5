"""POST /v1/responses: OpenAI's Responses API through the fleet's routing, failover, migration and limits.

    body (413) → JSON object with model and input (400) → responses_fields.check (400: unknown or
    refused fields, e.g. previous_response_id, store: true) → GenerateRequest with endpoint
    "responses" → router.stream (404 unknown model; 429/503 before the first chunk) → 200, the
    whole response object or the Responses event stream.

The gateway stays thin: the input items travel as the input's messages, the other engine fields
in the body; the worker reads them with vLLM's ResponsesRequest and runs vLLM's conversion to a
chat request (worker/openai/responses.py), so tools, text.format and the chat template keep vLLM's
meaning and the tool-call parser runs there. The router migrates the stream like any chat stream
after a worker dies; a constrained one (text.format, a forced tool_choice) cannot continue
exactly: a whole answer starts over once, a stream ends with an error event.
"""

from __future__ import annotations

from vllm_fleet.gateway import forward, responses_fields
from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.gateway.asgi import Response, StreamResponse
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.front_door import FrontDoor, answer_name
from vllm_fleet.gateway.json_body import json_object
from vllm_fleet.gateway.responses_output import ResponsesOutput
from vllm_fleet.gateway.translate import check_lengths
from vllm_fleet.protocol.sampling import is_constrained
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RoutingHints
from vllm_fleet.router import Router
from vllm_fleet.router.classes.service_class import SERVICE_TIERS

# Request fields the response object repeats, with OpenAI's defaults.
_ECHOED = {"instructions": None, "max_output_tokens": None, "temperature": None, "top_p": None, "tools": [],
           "tool_choice": "auto", "parallel_tool_calls": True, "text": {"format": {"type": "text"}},
           "metadata": None, "reasoning": None, "truncation": "disabled", "service_tier": "auto"}


class ResponsesHandler:
    """POST /v1/responses: the body → GenerateRequest mapping; ResponsesOutput shapes the answer,
    the front door (front_door.py) opens, streams and settles."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.router = door.router
        self.config = door.config

    async def create(self, call: Call) -> Response | StreamResponse:
        record = call.record
        body = _parse(await call.http.read_body(self.config.max_body_bytes))
        model = body["model"]
        record.model = model
        record.stream = bool(body.get("stream"))
        request = self._request(body, call)
        response_id = "resp_" + answer_name(body.get("request_id"), call.http.headers, record.request_id)
        echo = {name: body.get(name, default) for name, default in _ECHOED.items()}
        if record.stream:
            return await self.door.streamed(request, model, key=call.key_id, record=record,
                                            writer=ResponsesOutput(response_id, model, echo))
        answer = await self.door.whole(request, model, key=call.key_id, record=record,
                                       answer=lambda: ResponsesOutput(response_id, model, echo))
        return Response.json(answer)

    def _request(self, body: dict, call: Call) -> GenerateRequest:
        text_or_items = body["input"]
        # A string input is vLLM's one user message; the envelope carries it as that item.
        items = [{"role": "user", "content": text_or_items}] if isinstance(text_or_items, str) else text_or_items
        forwarded = responses_fields.engine_body(body)
        max_tokens = body.get("max_output_tokens")
        tier = body.get("service_tier") or "auto"
        if not isinstance(tier, str) or tier not in SERVICE_TIERS:
            raise bad_request(f"service_tier must be one of {', '.join(SERVICE_TIERS)}", param="service_tier")
        priority = body.get("priority") or 0
        if not isinstance(priority, int) or isinstance(priority, bool) or not -2**63 <= priority < 2**63:
            raise bad_request("priority must be a 64-bit integer", param="priority")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or not 1 <= max_tokens < 2**31):
            raise bad_request("max_output_tokens must be a positive integer", param="max_output_tokens")
        # No prompt estimate: input items carry ids and reasoning a template may drop, so their bytes
        # bound nothing; 0 is the one sure lower bound, and the limits on max_output_tokens apply.
        check_lengths(0, max_tokens, self.config, _context(self.router, body["model"]), "input",
                      max_tokens_param="max_output_tokens")
        session = call.http.headers.get("x-session-id", "") or body.get("session_id") or body.get("user") or ""
        return GenerateRequest(
            request_id=call.worker_request_id, inputs=[GenerateInput(messages=items)],
            body=forward.request_body("responses", forwarded), n=1, priority=priority, session_id=str(session),
            stream_interval_ms=self.config.stream_interval_ms, constrained=_constrained(forwarded),
            hints=RoutingHints(max_tokens=max_tokens, service_class=SERVICE_TIERS[tier]))


def _parse(raw: bytes) -> dict:
    body = json_object(raw)
    responses_fields.check(body)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request("model: a model name is required", param="model")
    items = body.get("input")
    if not (isinstance(items, str) or (isinstance(items, list) and items and all(isinstance(i, dict) for i in items))):
        raise bad_request("input: a string or a non-empty list of input items is required", param="input")
    if not isinstance(body.get("stream", False), (bool, type(None))):
        raise bad_request("stream must be a boolean", param="stream")
    for name in ("request_id", "session_id", "user"):
        if not isinstance(body.get(name) or "", str):
            raise bad_request(f"{name} must be a string", param=name)
    return body


def _context(router: Router, model: str) -> int | None:
    info = router.model_info(model)
    return info.max_model_len if info is not None else None


def _constrained(forwarded: dict) -> bool:
    """Whether decoding follows a grammar (text.format, structured_outputs, a forced tool_choice):
    such a stream cannot continue elsewhere after its first token."""
    text_format = (forwarded.get("text") or {}).get("format") if isinstance(forwarded.get("text"), dict) else None
    choice = forwarded.get("tool_choice")
    return is_constrained({"response_format": text_format, "structured_outputs": forwarded.get("structured_outputs"),
                           "tool_choice": choice if forwarded.get("tools") else None})

