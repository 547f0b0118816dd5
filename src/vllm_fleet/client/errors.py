"""gRPC status codes → the exception tree. The one place the client interprets codes."""

from __future__ import annotations

import grpc

from vllm_fleet.errors import (
    EngineDeadError,
    FleetError,
    InvalidRequestError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
    WorkerUnavailableError,
)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def error_from_rpc(exc: grpc.aio.AioRpcError | grpc.RpcError, address: str) -> FleetError:
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return error_from_status(code, details, address)


def error_from_status(code: grpc.StatusCode | int | None, details: str, address: str) -> FleetError:
    """The exception for a status, given as a StatusCode or its number (GenerateMany events)."""
    if isinstance(code, int):
        code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.INVALID_ARGUMENT or code == grpc.StatusCode.OUT_OF_RANGE:
        return InvalidRequestError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return WorkerOverloadedError(f"worker {address} is overloaded: {details}", worker=address)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return WorkerTimeoutError(f"worker {address}: deadline exceeded", worker=address)
    if code == grpc.StatusCode.UNAVAILABLE:
        return WorkerUnavailableError(f"worker {address} unavailable: {details}", worker=address)
    if code == grpc.StatusCode.FAILED_PRECONDITION and "engine" in details.lower():
        return EngineDeadError(f"worker {address}: {details}", worker=address)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return InvalidRequestError(details)
    return WorkerError(f"worker {address} failed ({code.name if code else 'unknown'}): {details}", worker=address)
