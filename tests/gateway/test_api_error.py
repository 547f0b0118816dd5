"""Typed errors from the router and workers become the OpenAI error a client sees, in one place."""

from __future__ import annotations

import pytest

from vllm_fleet import errors
from vllm_fleet.gateway.api_error import from_exception


@pytest.mark.parametrize("exc, status, code, param", [
    (errors.UnknownModelError("model 'x' is not served here; available: a, b", model="x"), 404, "model_not_found",
     "model"),
    (errors.InvalidRequestError("max_tokens too large", param="max_tokens"), 400, None, "max_tokens"),
    (errors.RateLimitedError("slow down", retry_after=2.5, reason="requests_per_min"), 429, "requests_per_min", None),
    (errors.NoWorkerError("none"), 503, "no_worker", None),
    (errors.DeadlineExceededError("late"), 504, "worker_timeout", None),
    (RuntimeError("boom"), 500, None, None),
])
def test_each_error_type_has_its_status_and_body(exc, status, code, param):
    error = from_exception(exc)
    assert (error.status, error.code, error.param) == (status, code, param)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    if status < 500:
        assert error.message == str(exc)  # the router's message, e.g. the list of served models
    else:
        assert "boom" not in error.message  # internals stay in the log
