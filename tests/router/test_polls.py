"""The pool's polls cost the gateway a unary gRPC call each (about a millisecond of CPU), so it
skips those another answer already covers: a Load the worker attached to a stream call stands
for a Load poll, and a fresh Load that carries the worker's health status stands for a health
check. A failed request still asks the worker itself at once."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from fakes import FakeClock
from support import wait_until
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.pool import Pool

ADDRESS = "10.0.0.1:50051"
POLL = 0.02


class CountingWorker:
    """A worker client that counts the calls made to it; the test sets its answers."""

    def __init__(self) -> None:
        self.status = "SERVING"
        self.answer = WorkerLoad()
        self.streaming: WorkerLoad | None = None
        self.health_calls = 0
        self.load_calls = 0
        self.load_fails = False

    async def health(self, timeout: float) -> str:
        self.health_calls += 1
        return self.status

    async def load(self, timeout: float) -> WorkerLoad:
        self.load_calls += 1
        if self.load_fails:
            raise WorkerUnavailableError("no answer", worker=ADDRESS)
        return self.answer

    async def info(self, timeout: float) -> WorkerInfo:
        return WorkerInfo(model="m", max_model_len=2048, engine="mock")

    def take_streamed_load(self) -> WorkerLoad | None:
        return self.streaming


class OneClient:
    def __init__(self, worker: CountingWorker) -> None:
        self.worker = worker

    def get(self, address: str) -> CountingWorker:
        return self.worker


@pytest.fixture
async def counted():
    worker = CountingWorker()
    clock = FakeClock()
    pool = Pool(StaticRegistry.from_spec(ADDRESS), OneClient(worker),
                RouterConfig(health_poll_interval_s=POLL, load_poll_interval_s=POLL),
                RouterMetrics(CollectorRegistry()), clock=clock)
    await pool.start()
    await wait_until(lambda: pool.worker(ADDRESS) is not None and pool.worker(ADDRESS).health == "SERVING",
                     timeout=5, message="the worker serving")
    yield pool, worker, clock
    await pool.close()


async def test_a_load_that_carries_health_stands_for_the_health_check(counted):
    pool, worker, _ = counted
    worker.answer = WorkerLoad(health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.answer, timeout=5, message="the Load answer")
    checks = worker.health_calls
    loads = worker.load_calls
    await wait_until(lambda: worker.load_calls >= loads + 10, timeout=5, message="ten more Load polls")
    assert worker.health_calls == checks  # ten health intervals passed without a health call
    # The status it follows is the Load's: the health service would still say SERVING.
    worker.answer = WorkerLoad(health="NOT_SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5,
                     message="NOT_SERVING from the Load answer")
    assert worker.health_calls == checks


async def test_a_stale_load_does_not_stand_for_the_health_check(counted):
    """A worker that stopped answering Loads is asked the usual way."""
    pool, worker, clock = counted
    worker.answer = WorkerLoad(health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.answer, timeout=5, message="the Load answer")
    worker.load_fails = True
    loads = worker.load_calls
    await wait_until(lambda: worker.load_calls > loads, timeout=5, message="a failed Load poll")
    clock.advance(1.0)  # the last answer is now fifty intervals old
    checks = worker.health_calls
    await wait_until(lambda: worker.health_calls >= checks + 2, timeout=5, message="health checks again")


async def test_without_health_in_the_load_the_health_check_stays(counted):
    """Workers that predate the field answer Loads without it."""
    pool, worker, _ = counted
    worker.answer = WorkerLoad()
    checks = worker.health_calls
    await wait_until(lambda: worker.health_calls >= checks + 3, timeout=5, message="health checks")


async def test_a_failed_request_asks_the_worker_itself(counted):
    pool, worker, _ = counted
    worker.answer = WorkerLoad(health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.answer, timeout=5, message="the Load answer")
    worker.load_fails = True  # the worker died: its last Load, still fresh, says SERVING
    worker.status = "UNREACHABLE"
    checks = worker.health_calls
    pool.report(ADDRESS, False)
    await wait_until(lambda: worker.health_calls > checks, timeout=5, message="a health call after the failure")
    await wait_until(lambda: pool.worker(ADDRESS).health == "UNREACHABLE", timeout=5, message="UNREACHABLE seen")
    # The Load answered before the check must not bring it back.
    checks = worker.health_calls
    await wait_until(lambda: worker.health_calls >= checks + 3, timeout=5, message="more health checks")
    assert pool.worker(ADDRESS).health == "UNREACHABLE"


async def test_a_load_streamed_by_the_worker_stands_for_the_load_poll(counted):
    pool, worker, _ = counted
    streamed = WorkerLoad(running=7, output_tokens_per_s=90.0, health="SERVING")
    worker.streaming = streamed  # a busy stream call brings one every turn
    await wait_until(lambda: pool.worker(ADDRESS).load is streamed, timeout=5, message="the streamed Load taken")
    polls = worker.load_calls
    turns = pool.worker(ADDRESS).loads
    await wait_until(lambda: pool.worker(ADDRESS).loads >= turns + 10, timeout=5, message="ten Load turns")
    assert worker.load_calls == polls
    # Once no stream brings one, the poller asks again.
    worker.streaming = None
    await wait_until(lambda: worker.load_calls > polls, timeout=5, message="a Load poll again")
