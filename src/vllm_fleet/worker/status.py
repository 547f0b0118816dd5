"""The one place an exception becomes a gRPC status.

Sites raise typed errors and never build statuses themselves; Generate aborts its call with
the status, GenerateMany reports it in the request's last event. In the order checked:

    WorkerUnavailableError (draining, no engine)  UNAVAILABLE
    DuplicateRequestError                         ALREADY_EXISTS
    InvalidRequestError                           INVALID_ARGUMENT  (`param` names the field)
    WorkerOverloadedError                         RESOURCE_EXHAUSTED
    anything else, once the engine is unhealthy   UNAVAILABLE       ("the engine died: ...")
    ValueError, TypeError                         INVALID_ARGUMENT  (vLLM refusing input it cannot take;
                                                                     an undecodable request, naming `param`)
    anything else                                 INTERNAL          (logged with its traceback)

Our own typed errors come first: they are decisions taken on purpose and say what they mean
even while the engine is dying. Anything else from a dead engine is the death, not its cause.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from vllm_fleet.errors import DuplicateRequestError, InvalidRequestError, WorkerOverloadedError, WorkerUnavailableError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestStatus:
    """How a failed request ends: a gRPC code, a message a person can act on, the field at fault."""

    code: grpc.StatusCode
    message: str
    param: str | None = None

    @property
    def code_value(self) -> int:
        """The code as its number, as a GenerateMany event carries it."""
        return self.code.value[0]


def status_for(exc: BaseException, *, engine_healthy: bool = True) -> RequestStatus:
    """The status a request that failed with `exc` ends with.

    `engine_healthy` is the engine's health when the request failed: an untyped error from a
    dead engine says the engine died (the router then retries elsewhere).
    """
    if isinstance(exc, WorkerUnavailableError):
        return RequestStatus(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, DuplicateRequestError):  # before its base class, InvalidRequestError
        return RequestStatus(grpc.StatusCode.ALREADY_EXISTS, str(exc))
    if isinstance(exc, InvalidRequestError):
        return RequestStatus(grpc.StatusCode.INVALID_ARGUMENT, str(exc), exc.param)
    if isinstance(exc, WorkerOverloadedError):
        return RequestStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    if not engine_healthy:
        logger.error("engine died during a request: %s", exc)
        return RequestStatus(grpc.StatusCode.UNAVAILABLE, f"the engine died: {exc}")
    if isinstance(exc, (ValueError, TypeError)):
        return RequestStatus(grpc.StatusCode.INVALID_ARGUMENT, str(exc), getattr(exc, "param", None))
    logger.error("the worker failed a request", exc_info=exc)
    return RequestStatus(grpc.StatusCode.INTERNAL, f"the worker failed this request: {exc}")
