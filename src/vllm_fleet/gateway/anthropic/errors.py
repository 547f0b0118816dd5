"""Errors in Anthropic's shape, for the Messages routes.

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

The status and message come from the one mapping every route uses (api_error.from_exception);
here they get Anthropic's error types. Anthropic says "overloaded" with 529, which its SDKs
retry; the fleet's 503s (no worker serving, a worker overloaded) become that on these routes.
"""

from __future__ import annotations

import json

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.asgi import JSON_TYPE, Response

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
          429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}
OVERLOADED = 529


def anthropic_status(error: ApiError) -> int:
    return OVERLOADED if error.status == 503 else error.status


def anthropic_body(error: ApiError) -> dict:
    status = anthropic_status(error)
    return {"type": "error", "error": {"type": _TYPES.get(status, "api_error"), "message": error.message}}


def anthropic_error_bytes(error: ApiError) -> tuple[int, bytes]:
    """The status and JSON body a Messages client gets for `error`."""
    return anthropic_status(error), json.dumps(anthropic_body(error), ensure_ascii=False).encode()


def anthropic_response(error: ApiError) -> Response:
    status, body = anthropic_error_bytes(error)
    return Response(status, body, JSON_TYPE, error.headers())
