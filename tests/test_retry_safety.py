"""Whether a retry is safe is the error type's (errors.py), one table for the whole tree; the
router's failover/migration decisions read it (router/retry.py for streams, router/pooling.py for
pooling calls), and so do Spark's row resends (tests/spark/test_answerer.py drives each class
through the answerer)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_fleet import errors
from vllm_fleet.errors import FleetError, WorkerError
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody
from vllm_fleet.router.pooling import _before_retry
from vllm_fleet.router.quota.store import QuotaStoreUnavailable
from vllm_fleet.router.retry import check_retry

# class → (recoverable: tried again now, possibly elsewhere; resend_safe: the whole request sent again)
TABLE: dict[type[FleetError], tuple[bool, bool]] = {
    errors.FleetError: (False, False),
    errors.ConfigError: (False, False),
    errors.ModelError: (False, False),
    errors.InvalidRequestError: (False, False),
    errors.UnknownModelError: (False, False),
    errors.DuplicateRequestError: (False, True),         # the same id, once the first run ended
    errors.WorkerError: (True, True),
    errors.WorkerUnavailableError: (True, True),
    errors.WorkerOverloadedError: (True, True),
    errors.WorkerTimeoutError: (True, True),
    errors.DeadlineExceededError: (False, False),
    errors.MigrationUnsupportedError: (False, True),     # fatal for the stream, not for the request
    errors.KvEventsUnsupportedError: (False, False),
    errors.TokenizerFilesError: (False, False),
    errors.IntrospectUnsupportedError: (False, False),
    errors.NoWorkerError: (True, True),
    errors.RateLimitedError: (True, True),
    errors.ProcessStartError: (False, False),
    QuotaStoreUnavailable: (True, True),
}


def make(cls: type[FleetError]) -> FleetError:
    """An instance of `cls` with whatever arguments its constructor needs."""
    extra = {errors.UnknownModelError: {"model": "m"}, errors.RateLimitedError: {"retry_after": 1.0, "reason": "r"},
             errors.ProcessStartError: {"returncode": 1, "log_tail": ""}}
    return cls("boom", **extra.get(cls, {}))


def _every_subclass(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _every_subclass(sub)
    return found


def test_the_table_names_every_error_class():
    assert _every_subclass(FleetError) == set(TABLE), "a new error class says here whether a retry is safe"


@pytest.mark.parametrize("cls", list(TABLE), ids=lambda c: c.__name__)
def test_retry_safety_is_the_type_s_and_every_instance_carries_it(cls):
    recoverable, resend_safe = TABLE[cls]
    assert (cls.recoverable, cls.resend_safe) == (recoverable, resend_safe)
    error = make(cls)
    assert (error.recoverable, error.resend_safe) == (recoverable, resend_safe)
    assert not recoverable or resend_safe, "what may be retried now may also be sent again whole"


def _context(max_attempts: int = 3) -> SimpleNamespace:
    counter = SimpleNamespace(inc=lambda *_: None, labels=lambda *_: counter)
    metrics = SimpleNamespace(worker_failures=counter, rejections=counter, migrations=counter, failovers=counter,
                              retries=counter)
    return SimpleNamespace(metrics=metrics, config=SimpleNamespace(max_attempts=max_attempts),
                           budget=SimpleNamespace(try_spend=lambda *_: True),
                           pool=SimpleNamespace(retry_headroom=lambda *_: 1.0))


WORKER_ERRORS = sorted((c for c in TABLE if issubclass(c, WorkerError)), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", WORKER_ERRORS, ids=lambda c: c.__name__)
def test_the_router_fails_over_exactly_the_recoverable_worker_errors(cls):
    request = GenerateRequest(request_id="r", inputs=[GenerateInput(text="x")], body=RequestBody("completion", b"{}"))
    error = make(cls)
    nothing_delivered = SimpleNamespace(any=False, tokens=lambda: 0)
    if cls.recoverable:
        check_retry(_context(), error, "w:1", attempts=1, delivered=nothing_delivered, request=request)
    else:
        with pytest.raises(cls):
            check_retry(_context(), error, "w:1", attempts=1, delivered=nothing_delivered, request=request)


@pytest.mark.parametrize("cls", WORKER_ERRORS, ids=lambda c: c.__name__)
def test_a_pooling_call_fails_over_exactly_the_recoverable_worker_errors(cls):
    error = make(cls)
    if cls.recoverable:
        _before_retry(_context(), error, "w:1", 1, "r")
    else:
        with pytest.raises(cls):
            _before_retry(_context(), error, "w:1", 1, "r")
