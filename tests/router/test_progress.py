"""What the pool counts as a worker's progress (the stall watchdog's patience depends on it):
output, never requests it merely holds, and never from a worker that says it is not serving."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from fakes import FakeClock
from support import wait_until
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.pool import Pool

ADDRESS = "10.0.0.1:50051"
POLL = 0.02


class ScriptedWorker:
    """A worker client whose answers the test sets."""

    def __init__(self) -> None:
        self.status = "SERVING"
        self.answer = WorkerLoad()

    async def health(self, timeout: float) -> str:
        return self.status

    async def load(self, timeout: float) -> WorkerLoad:
        return self.answer

    async def info(self, timeout: float) -> WorkerInfo:
        return WorkerInfo(model="m", max_model_len=2048, engine="mock")

    def take_streamed_load(self) -> WorkerLoad | None:
        return None


class ScriptedClients:
    def __init__(self, worker: ScriptedWorker) -> None:
        self.worker = worker

    def get(self, address: str) -> ScriptedWorker:
        return self.worker


@pytest.fixture
async def scripted():
    worker = ScriptedWorker()
    clock = FakeClock()
    pool = Pool(StaticRegistry.from_spec(ADDRESS), ScriptedClients(worker),
                RouterConfig(health_poll_interval_s=POLL, load_poll_interval_s=POLL),
                RouterMetrics(CollectorRegistry()), clock=clock)
    await pool.start()
    await wait_until(lambda: pool.worker(ADDRESS) is not None and pool.worker(ADDRESS).health == "SERVING",
                     timeout=5, message="the scripted worker serving")
    yield pool, worker, clock
    await pool.close()


async def answered(pool: Pool, load: WorkerLoad) -> None:
    await wait_until(lambda: pool.worker(ADDRESS).load is load, timeout=5, message="the new Load answer")


async def test_held_requests_without_output_are_not_progress(scripted):
    """A wedged engine keeps reporting the requests it holds."""
    pool, worker, _ = scripted
    worker.answer = WorkerLoad(running=16, waiting=3, output_tokens_per_s=0.0)
    await answered(pool, worker.answer)
    assert not pool.progressing(ADDRESS)


async def test_output_tokens_in_a_fresh_load_are_progress(scripted):
    pool, worker, _ = scripted
    worker.answer = WorkerLoad(running=16, output_tokens_per_s=120.0)
    await answered(pool, worker.answer)
    assert pool.progressing(ADDRESS)


async def test_a_worker_that_says_not_serving_is_not_progressing_whatever_its_load(scripted):
    pool, worker, _ = scripted
    worker.answer = WorkerLoad(running=16, output_tokens_per_s=120.0)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert not pool.progressing(ADDRESS)


async def test_a_draining_worker_that_still_produces_is_progressing(scripted):
    pool, worker, _ = scripted
    worker.answer = WorkerLoad(running=4, output_tokens_per_s=50.0, draining=True)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert pool.progressing(ADDRESS)


async def test_a_chunk_to_our_own_stream_is_progress_until_it_is_old(scripted):
    pool, worker, clock = scripted
    worker.answer = WorkerLoad(running=1, output_tokens_per_s=0.0)
    await answered(pool, worker.answer)
    lease = pool.try_acquire(ADDRESS, 100)
    lease.progress(3)
    assert pool.progressing(ADDRESS)
    clock.advance(60)
    assert not pool.progressing(ADDRESS)
    lease.release()
