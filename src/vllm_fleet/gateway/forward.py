"""The request body the gateway forwards, and the envelope values it takes out of it.

Every ENGINE field the client sent (fields.py) goes, as sent, into the request body
(`GenerateRequest.body`): vLLM's own request model on the worker gives it its meaning and
validates it, so the gateway checks no more than JSON shape here. The ENVELOPE fields (n,
priority) keep vLLM's meaning but travel in the envelope, where the fleet may reschedule them;
their shape is checked by the gateway's schema, since the envelope is typed.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel

from vllm_fleet.gateway import fields
from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.protocol.types import RequestBody

# The standard encoder, not orjson: orjson writes NaN as null, silently changing what the client
# sent; this one refuses it (the client gets a 400).
_dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def engine_body(endpoint: str, body: BaseModel) -> dict:
    """The ENGINE fields the client set, modelled (validated by the schema) or not. A modelled
    field sent as null is left out: null means the default there, which vLLM then applies."""
    names = fields.engine_fields(endpoint)
    forwarded = {name: getattr(body, name) for name in body.model_fields_set
                 if name in names and getattr(body, name) is not None}
    for name, value in (body.model_extra or {}).items():
        if name in names:
            forwarded[name] = value
    return forwarded


def request_body(endpoint: str, forwarded: dict) -> RequestBody:
    try:
        body_json = _dump(forwarded).encode()
    except ValueError:
        name = next((k for k, v in forwarded.items() if _has_non_finite(v)), None)
        raise bad_request(f"{name or 'body'}: NaN and Infinity are not JSON numbers", param=name,
                          code="invalid_value") from None
    return RequestBody(endpoint=endpoint, body_json=body_json)


def priority_of(body: BaseModel) -> int:
    """vLLM's `priority` (lower runs first), for the envelope; the schema checked its shape."""
    return getattr(body, "priority", None) or 0


def _has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


__all__ = ["engine_body", "priority_of", "request_body"]
