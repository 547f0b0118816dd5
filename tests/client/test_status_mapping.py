"""gRPC status → the exception tree (client/errors.py): the table the router and Spark rely on."""

from __future__ import annotations

import grpc
import pytest

from vllm_fleet.client.errors import error_from_status
from vllm_fleet.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
    WorkerUnavailableError,
)

ADDRESS = "10.0.0.7:50051"

# code → (exact type, recoverable). Recoverable errors are retried elsewhere by the router.
TABLE = [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidRequestError, False),
    (grpc.StatusCode.OUT_OF_RANGE, InvalidRequestError, False),
    (grpc.StatusCode.ALREADY_EXISTS, DuplicateRequestError, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, WorkerOverloadedError, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, WorkerTimeoutError, True),
    (grpc.StatusCode.UNAVAILABLE, WorkerUnavailableError, True),
    (grpc.StatusCode.FAILED_PRECONDITION, WorkerError, True),
    (grpc.StatusCode.INTERNAL, WorkerError, True),
    (grpc.StatusCode.UNKNOWN, WorkerError, True),
]


@pytest.mark.parametrize(("code", "error", "recoverable"), TABLE, ids=[c.name for c, _, _ in TABLE])
def test_each_code_maps_to_its_type_whether_given_as_a_code_or_its_number(code, error, recoverable):
    for given in (code, code.value[0]):  # Generate raises StatusCode; GenerateMany events carry numbers
        exc = error_from_status(given, "details from the worker", ADDRESS)
        assert type(exc) is error
        assert exc.recoverable is recoverable
        assert "details from the worker" in str(exc) or error is WorkerTimeoutError
        if isinstance(exc, WorkerError):
            assert exc.worker == ADDRESS


def test_an_unknown_code_number_is_a_recoverable_worker_error():
    exc = error_from_status(999, "what is this", ADDRESS)
    assert type(exc) is WorkerError and exc.recoverable and "UNKNOWN" in str(exc)


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE])
def test_a_refusal_carries_the_field_it_names(code):
    assert error_from_status(code, "max_tokens is too large", ADDRESS, param="max_tokens").param == "max_tokens"
    assert error_from_status(code, "bad", ADDRESS, param="").param is None  # proto3 "" = no field named
    assert error_from_status(code, "bad", ADDRESS).param is None


def test_the_meaning_comes_from_the_code_not_the_message():
    # A dead engine reaches the client as UNAVAILABLE; no message text turns another code into it.
    exc = error_from_status(grpc.StatusCode.FAILED_PRECONDITION, "engine died", ADDRESS)
    assert type(exc) is WorkerError
    exc = error_from_status(grpc.StatusCode.INVALID_ARGUMENT, "request r1 is already running", ADDRESS)
    assert type(exc) is InvalidRequestError
