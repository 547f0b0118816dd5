"""What the worker gets of a request's fields besides its inputs.

Every ENGINE field the client sent (fields.py) goes, as sent, into `OpenAIOptions.body_json`:
vLLM's own request model on the worker gives it its meaning and validates it, so the gateway
checks no more than JSON shape here. The typed `SamplingParams` are filled too, for the parts
of the fleet that read them (the router's cost estimate, the mock engine, migration's token
accounting); a value of the wrong JSON type is left out of them and refused by vLLM instead.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel

from vllm_fleet.gateway import fields
from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.protocol.types import OpenAIOptions, SamplingParams

# The standard encoder, not orjson: orjson writes NaN as null, silently changing what the client
# sent; this one refuses it (the client gets a 400).
_dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_INT32 = (-(2**31), 2**31 - 1)


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


def openai_options(endpoint: str, forwarded: dict) -> OpenAIOptions:
    try:
        body_json = _dump(forwarded).encode()
    except ValueError:
        name = next((k for k, v in forwarded.items() if _has_non_finite(v)), None)
        raise bad_request(f"{name or 'body'}: NaN and Infinity are not JSON numbers", param=name,
                          code="invalid_value") from None
    return OpenAIOptions(endpoint=endpoint, body_json=body_json)


def _has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def is_constrained(forwarded: dict) -> bool:
    """Whether decoding follows a grammar: such a stream cannot migrate after its first token."""
    response_format = forwarded.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return True
    if forwarded.get("structured_outputs") is not None:
        return True
    tool_choice = forwarded.get("tool_choice")
    return tool_choice == "required" or isinstance(tool_choice, dict)


def _typed(forwarded: dict, name: str, kind: type | tuple[type, ...]):
    value = forwarded.get(name)
    if isinstance(value, bool) and kind is not bool:
        return None  # JSON true is not a number
    if isinstance(value, float) and not abs(value) < 3.4e38:
        return None  # NaN, infinite, or beyond a 32-bit float
    if isinstance(value, int) and not isinstance(value, bool) and not _INT32[0] <= value <= _INT32[1]:
        return None  # beyond the wire's widths; vLLM judges the value itself
    return value if isinstance(value, kind) else None


def _token_ids(value) -> list[int]:
    if isinstance(value, list) and all(type(v) is int and 0 <= v <= _INT32[1] for v in value):
        return list(value)
    return []


def _logit_bias(value) -> dict[int, float]:
    if not isinstance(value, dict):
        return {}
    try:
        bias = {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return {}
    if all(_INT32[0] <= k <= _INT32[1] and math.isfinite(v) for k, v in bias.items()):
        return bias
    return {}


def fill_extras(params: SamplingParams, forwarded: dict) -> None:
    """vLLM's sampling extras into the typed params, where their JSON type is right."""
    number = (int, float)
    params.ignore_eos = _typed(forwarded, "ignore_eos", bool) or False
    params.min_tokens = _typed(forwarded, "min_tokens", int)
    params.repetition_penalty = _typed(forwarded, "repetition_penalty", number)
    params.min_p = _typed(forwarded, "min_p", number)
    params.stop_token_ids = _token_ids(forwarded.get("stop_token_ids"))
    params.allowed_token_ids = _token_ids(forwarded.get("allowed_token_ids"))
    params.logit_bias = _logit_bias(forwarded.get("logit_bias"))
    bad_words = forwarded.get("bad_words")
    params.bad_words = list(bad_words) if isinstance(bad_words, list) and all(isinstance(w, str) for w in bad_words) else []
    params.include_stop_str_in_output = _typed(forwarded, "include_stop_str_in_output", bool) or False
    params.skip_special_tokens = _typed(forwarded, "skip_special_tokens", bool)
    params.truncate_prompt_tokens = _typed(forwarded, "truncate_prompt_tokens", int)


__all__ = ["engine_body", "fill_extras", "is_constrained", "openai_options"]
