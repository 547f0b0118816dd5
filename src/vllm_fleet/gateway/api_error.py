"""OpenAI-style error bodies, and the one place that maps our exceptions onto HTTP statuses.

Every error leaves the gateway as `{"error": {"message", "type", "param", "code"}}`, with a
status the client can act on: 4xx means change the request, 429/503 carry Retry-After.
"""

from __future__ import annotations

import json
import math

from vllm_fleet import errors


class ApiError(Exception):
    """An error with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.extra_headers: list[tuple[bytes, bytes]] = []

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after is None:
            return self.extra_headers
        # Retry-After is whole seconds; round up so a client that obeys it is not refused again.
        return [(b"retry-after", str(max(1, math.ceil(self.retry_after))).encode()), *self.extra_headers]


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="authentication_error", code="invalid_api_key")


def from_exception(exc: BaseException) -> ApiError:
    """The ApiError a client sees for `exc` (router, worker, or our own)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, errors.InvalidRequestError):
        if isinstance(exc, errors.UnknownModelError):
            return ApiError(404, str(exc), param=exc.param or "model", code="model_not_found")
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, errors.RateLimitedError):
        return ApiError(429, str(exc), type="rate_limit_error", code=exc.reason, retry_after=exc.retry_after)
    if isinstance(exc, errors.NoWorkerError):
        return ApiError(503, str(exc), type="service_unavailable", code="no_worker", retry_after=exc.retry_after)
    if isinstance(exc, errors.IntrospectUnsupportedError):
        return ApiError(501, str(exc), type="not_implemented", code="introspect_unsupported")
    if isinstance(exc, errors.MigrationUnsupportedError):
        # A worker died mid-answer and the answer cannot continue elsewhere: the client retries it whole.
        return ApiError(502, str(exc), type="upstream_error", code="migration_unsupported")
    if isinstance(exc, errors.WorkerTimeoutError):
        return ApiError(504, str(exc), type="timeout", code="worker_timeout")
    if isinstance(exc, errors.WorkerOverloadedError):
        return ApiError(503, str(exc), type="service_unavailable", code="overloaded", retry_after=1.0)
    if isinstance(exc, errors.WorkerError):
        return ApiError(502, str(exc), type="upstream_error", code="worker_error")
    if isinstance(exc, TimeoutError):
        return ApiError(504, "the request did not finish before its deadline", type="timeout", code="deadline")
    return ApiError(500, "internal error; the gateway log has details under this request id", type="server_error")
