"""gRPC status codes → the exception tree. The one place the client interprets codes.

The worker maps its errors to codes in one place too (worker/service.py), as the design says:
bad input → INVALID_ARGUMENT (with the field at fault beside it), a request id it is already
running → ALREADY_EXISTS, overload → RESOURCE_EXHAUSTED, draining or engine dead → UNAVAILABLE.
Only the code and that field are read here, never the message text. Whether a retry is safe
comes with the type chosen here (`recoverable`, `resend_safe`: errors.py), never decided here.
"""

from __future__ import annotations

import grpc

from vllm_fleet.errors import (
    DuplicateRequestError,
    FleetError,
    InvalidRequestError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
    WorkerUnavailableError,
)
from vllm_fleet.protocol import PARAM_METADATA_KEY

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def error_from_rpc(exc: grpc.aio.AioRpcError | grpc.RpcError, address: str) -> FleetError:
    """The exception for a failed call; a refused Generate names its field in trailing metadata."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return error_from_status(code, details, address, param=_param_of(exc))


def _param_of(exc: grpc.RpcError) -> str | None:
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == PARAM_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


def error_from_status(code: grpc.StatusCode | int | None, details: str, address: str, *,
                      param: str | None = None) -> FleetError:
    """The exception for a status, given as a StatusCode or its number (GenerateMany events).

    `param` is the request field at fault, sent with INVALID_ARGUMENT ("" or None: none named).
    """
    if isinstance(code, int):
        code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.INVALID_ARGUMENT or code == grpc.StatusCode.OUT_OF_RANGE:
        return InvalidRequestError(details, param=param or None)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return DuplicateRequestError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return WorkerOverloadedError(f"worker {address} is overloaded: {details}", worker=address)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return WorkerTimeoutError(f"worker {address}: deadline exceeded", worker=address)
    if code == grpc.StatusCode.UNAVAILABLE:
        return WorkerUnavailableError(f"worker {address} unavailable: {details}", worker=address)
    return WorkerError(f"worker {address} failed ({code.name if code else 'unknown'}): {details}", worker=address)
