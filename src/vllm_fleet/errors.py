"""The exception tree of vllm-fleet.

Whether a retry is safe is a property of the error's type, set here on each class and read by
every caller (the router's failover and migration, its short calls, Spark's row resends); no
caller keeps a list of types of its own. Two class attributes say it:

- `recoverable` (R): the same request may succeed if it is tried again now, possibly on another
  worker, continuing after what the caller already has. The router fails over and migrates
  only these.
- `resend_safe` (S): the whole request, sent again from the start, may succeed. Spark resends a
  row's request only for these. Every recoverable error is resend-safe; two fatal ones are too.

                               R  S
    FleetError                 -  -
    ├── ConfigError            -  -   a setting is wrong; the message says which and how to fix it
    ├── ModelError             -  -   the model cannot be found, provisioned or loaded
    ├── InvalidRequestError    -  -   the request itself is bad (HTTP 400, gRPC INVALID_ARGUMENT); `param` names the field
    │   ├── UnknownModelError  -  -   no worker serves the requested model (HTTP 404)
    │   └── DuplicateRequestError - S the worker already runs a request with this id (gRPC ALREADY_EXISTS):
    │                                 not resent by the router (a copy elsewhere would compute it twice);
    │                                 a caller that reuses ids on purpose (Spark's answerer, for a retried
    │                                 task) waits and sends the same id again once the first run ended
    ├── WorkerError            R  S   something went wrong on or with one worker
    │   ├── WorkerUnavailableError   R S  the worker cannot be reached, is draining, or its engine died (gRPC UNAVAILABLE)
    │   ├── WorkerOverloadedError    R S  the worker refused for capacity (gRPC RESOURCE_EXHAUSTED)
    │   ├── WorkerTimeoutError       R S  a deadline passed, or the stream stalled
    │   │   └── DeadlineExceededError  - -  the caller's own deadline passed (nothing left to retry in)
    │   ├── MigrationUnsupportedError  - S  a worker failed mid-answer and the answer cannot continue on
    │   │                                   another worker (grammar-constrained decoding); the whole request,
    │   │                                   sent again, starts a fresh grammar
    │   ├── KvEventsUnsupportedError   - -  the worker relays no KV-cache events (gRPC FAILED_PRECONDITION,
    │   │                                   or UNIMPLEMENTED): route it without them
    │   ├── TokenizerFilesError        - -  a worker has no tokenizer files to send (gRPC FAILED_PRECONDITION),
    │   │                                   or sent some a router cannot keep (a name off the allow-list)
    │   └── IntrospectUnsupportedError - -  a worker cannot answer /tokenize or a render route
    │                                       (gRPC FAILED_PRECONDITION: mock engine, vLLM 0.26; or UNIMPLEMENTED)
    ├── NoWorkerError          R  S   later: no serving worker can take the request now
    ├── RateLimitedError       R  S   later: admission refused (HTTP 429); `retry_after` seconds
    └── ProcessStartError      -  -   a process we started (worker, gateway) exited or was not ready in time;
                                      the message ends with its log
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error vllm-fleet raises on purpose. Whether a retry is safe is its type's
    (`recoverable`, `resend_safe`: the module docstring), never an instance's."""

    recoverable: bool = False   # tried again now, possibly elsewhere, after what the caller has
    resend_safe: bool = False   # the whole request, sent again from the start

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(FleetError):
    """A setting is wrong or missing. Fatal: fix the configuration."""

    recoverable = resend_safe = False


class ModelError(FleetError):
    """The model cannot be found, provisioned or loaded. Fatal."""

    recoverable = resend_safe = False


class InvalidRequestError(FleetError):
    """The request is malformed or asks for something impossible. Fatal: fix the request.

    `param` names the offending field where there is one (the OpenAI error body carries it).
    """

    recoverable = resend_safe = False

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class WorkerError(FleetError):
    """Something went wrong on, or on the way to, one worker. Recoverable elsewhere."""

    recoverable = resend_safe = True

    def __init__(self, message: str, *, worker: str | None = None) -> None:
        super().__init__(message)
        self.worker = worker


class WorkerUnavailableError(WorkerError):
    """The worker cannot be reached, is draining, or cannot generate. Recoverable."""

    recoverable = resend_safe = True


class WorkerOverloadedError(WorkerError):
    """The worker refused the request for lack of capacity. Recoverable."""

    recoverable = resend_safe = True


class WorkerTimeoutError(WorkerError):
    """A deadline passed or the stream stalled. Recoverable (the request may be retried)."""

    recoverable = resend_safe = True


class NoWorkerError(FleetError):
    """No serving worker can take the request now. Recoverable once workers return."""

    recoverable = resend_safe = True

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimitedError(FleetError):
    """Admission refused the request: a key's budget or a class queue is full. Retry later.

    `reason` is a short label for metrics (e.g. "requests_per_min", "tokens_per_min", "queue_full").
    """

    recoverable = resend_safe = True

    def __init__(self, message: str, *, retry_after: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason


class UnknownModelError(InvalidRequestError):
    """No worker in the pool serves the requested model (HTTP 404). Fatal: ask for a served model."""

    recoverable = resend_safe = False

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message, param="model")
        self.model = model


class DeadlineExceededError(WorkerTimeoutError):
    """The caller's deadline passed (HTTP 504). Fatal: no time is left to retry in."""

    recoverable = resend_safe = False


class DuplicateRequestError(InvalidRequestError):
    """The worker is already running a request with this id (gRPC ALREADY_EXISTS).

    Not recoverable by a resend now, on this worker or another: the first run is still going,
    and a copy elsewhere would compute the same answer twice. Spark's answerer derives ids from
    rows, so this means a retried task met its own first attempt: it waits, then sends again.
    """

    recoverable = False
    resend_safe = True   # the same id, once the first run ended (spark/answerer.py waits for it)


class MigrationUnsupportedError(WorkerError):
    """A worker failed after part of the answer was delivered, and the rest cannot be generated
    elsewhere: vLLM starts a structured-output grammar at the first generated token, so a
    grammar-constrained answer cannot continue on another worker. Fatal for this stream (a
    continuation could break the grammar); the whole request, sent again, may succeed.
    """

    recoverable = False
    resend_safe = True


class KvEventsUnsupportedError(WorkerError):
    """The worker relays no KV-cache events: its engine has none (prefix caching or --kv-events off, a
    mock without --mock-kv-blocks). Fatal for this worker: asking again will not help; route to it
    without knowing what it holds.
    """

    recoverable = resend_safe = False


class TokenizerFilesError(WorkerError):
    """A worker cannot send its model's tokenizer files (its engine has none as files: a GGUF
    tokenizer, a mock without one), or sent files a router refuses to keep (a name off the
    allow-list, a file cut short). Fatal for that worker's answer: asking again gets the same;
    a router routes without token ids for the model meanwhile.
    """

    recoverable = resend_safe = False


class IntrospectUnsupportedError(WorkerError):
    """A worker cannot answer /tokenize, /detokenize or a render route: its engine has no vLLM
    tokenizer (the mock), or its vLLM keeps the serving classes elsewhere (0.26). Fatal for that
    worker's answer; a worker on another engine or vLLM version may answer.
    """

    recoverable = resend_safe = False


class ProcessStartError(FleetError):
    """A process we started (a worker, a gateway) exited, or was not ready in time, while starting.

    Fatal for that start: the message ends with the last lines of its log, which say why.
    `returncode` is None when the process was still running (it was not ready in time).
    """

    recoverable = resend_safe = False

    def __init__(self, message: str, *, returncode: int | None, log_tail: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = log_tail
