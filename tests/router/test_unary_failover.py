"""router/unary.py: a short call goes to one worker of the model and fails over when it is down."""

from __future__ import annotations

import pytest

from vllm_fleet.errors import InvalidRequestError, NoWorkerError, WorkerUnavailableError
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView
from vllm_fleet.router.unary import call_any_worker


def _snapshot(*views: WorkerView) -> PoolSnapshot:
    return PoolSnapshot(workers=tuple(views), taken_at=0.0)


class _Client:
    def __init__(self, address: str, error: Exception | None = None) -> None:
        self.address, self.error = address, error

    async def answer(self) -> str:
        if self.error is not None:
            raise self.error
        return self.address


async def test_a_down_worker_hands_the_call_to_the_next():
    snapshot = _snapshot(WorkerView("a:1", model="m"), WorkerView("b:1", model="m", in_flight=3),
                         WorkerView("c:1", model="other"))
    down = {"a:1": WorkerUnavailableError("gone", worker="a:1")}
    answer = await call_any_worker(snapshot, lambda a: _Client(a, down.get(a)), "m", lambda c: c.answer())
    assert answer == "b:1"


async def test_a_refused_request_is_not_retried_and_no_worker_is_503():
    snapshot = _snapshot(WorkerView("a:1", model="m"), WorkerView("b:1", model="m", in_flight=1))
    tried = []

    def connect(address):
        tried.append(address)
        return _Client(address, InvalidRequestError("bad", param="prompt"))

    with pytest.raises(InvalidRequestError):
        await call_any_worker(snapshot, connect, "m", lambda c: c.answer())
    assert tried == ["a:1"]
    with pytest.raises(NoWorkerError):
        await call_any_worker(snapshot, connect, "absent", lambda c: c.answer())
