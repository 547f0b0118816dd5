"""The one reading of a request body that must be a JSON object, and its two 400s.

    request body is not valid JSON: <why>      code invalid_json
    request body must be a JSON object         code invalid_type

Every route that takes a JSON body says these the same way: the routes that read the body with
json (`json_object`: Responses, pooling, introspection, LoRA admin, Batch API) and the ones that
validate it with a pydantic schema (`whole_body_error`: chat/completions, Anthropic Messages).
The errors are OpenAI's shape; app.py gives them Anthropic's on Anthropic's routes.
"""

from __future__ import annotations

import json

from vllm_fleet.gateway.api_error import ApiError, bad_request


def json_object(body: bytes) -> dict:
    """The body's JSON object; 400 when it is not JSON, or not an object. A route whose body may be
    empty says what empty means: `json_object(body or b"{}")`."""
    try:
        value = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        raise _invalid_json(str(exc)) from None
    if not isinstance(value, dict):
        raise _not_an_object()
    return value


def whole_body_error(error: dict) -> ApiError | None:
    """The 400 for a pydantic error (one of `ValidationError.errors()`) about the body as a whole:
    not JSON, or not an object; None for an error about a field."""
    if error["type"] == "json_invalid":
        return _invalid_json(error["msg"])
    if error["type"] in ("model_type", "dict_type") and not error["loc"]:
        return _not_an_object()
    return None


def _invalid_json(why: str) -> ApiError:
    return bad_request(f"request body is not valid JSON: {why}", code="invalid_json")


def _not_an_object() -> ApiError:
    return bad_request("request body must be a JSON object", code="invalid_type")
