"""/v1/messages in /openapi.json: the request schema (with the field table's other fields) and
Anthropic's error body."""

from __future__ import annotations

from vllm_fleet.gateway.anthropic.errors import OVERLOADED
from vllm_fleet.gateway.anthropic.request import FIELDS, MessagesRequest

_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"},
    "error": {"type": "object", "required": ["type", "message"],
              "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
_STATUSES = {"400": "Invalid request (the field is named in the message)", "401": "Missing or unknown key",
             "404": "Unknown model", "413": "Request body too large", "429": "Rate limited; see Retry-After",
             "502": "The workers failed the request", str(OVERLOADED): "No worker can take the request now (overloaded)",
             "504": "The request did not finish before its deadline"}


def schemas() -> dict:
    schema = MessagesRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    properties = schema.setdefault("properties", {})
    for name, rule in FIELDS.items():
        properties.setdefault(name, {"description": f"{rule.kind.value}: {rule.why}"})
    schema["additionalProperties"] = False
    return {**defs, "MessagesRequest": schema, "AnthropicError": _ERROR}


def path(auth: bool) -> dict:
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/AnthropicError"}}}
    codes = [code for code in _STATUSES if auth or code != "401"]
    return {"post": {
        "summary": "Create a message (Anthropic's Messages API)",
        **({"security": [{"bearer": []}]} if auth else {}),
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/MessagesRequest"}}}},
        "responses": {
            "200": {"description": "A message object, or Anthropic's server-sent events when stream is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{code: {"description": _STATUSES[code], "content": error} for code in codes},
        },
    }}
