"""What the pool counts as a worker's progress (the stall watchdog's patience depends on it):
output, never requests it merely holds, and never from a worker that says it is not serving."""

from __future__ import annotations

import dataclasses

from fakes import POOL_WORKER as ADDRESS
from support import wait_until
from vllm_fleet.protocol.types import WorkerLoad
from vllm_fleet.router.pool import Pool


async def answered(pool: Pool, load: WorkerLoad) -> None:
    """Until the pool took `load`. These Loads carry no health (a worker that predates the field),
    so the pool's copy has the health service's status filled in."""
    def taken() -> bool:
        current = pool.worker(ADDRESS).load
        return current is not None and dataclasses.replace(current, health=load.health) == load

    await wait_until(taken, timeout=5, message="the new Load answer")


async def test_held_requests_without_output_are_not_progress(scripted_pool):
    """A wedged engine keeps reporting the requests it holds."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, waiting=3, output_tokens_per_s=0.0)
    await answered(pool, worker.answer)
    assert not pool.progressing(ADDRESS)


async def test_output_tokens_in_a_fresh_load_are_progress(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, output_tokens_per_s=120.0)
    await answered(pool, worker.answer)
    assert pool.progressing(ADDRESS)


async def test_a_worker_that_says_not_serving_is_not_progressing_whatever_its_load(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, output_tokens_per_s=120.0)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert not pool.progressing(ADDRESS)


async def test_a_draining_worker_that_still_produces_is_progressing(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=4, output_tokens_per_s=50.0, draining=True)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert pool.progressing(ADDRESS)


async def test_a_chunk_to_our_own_stream_is_progress_until_it_is_old(scripted_pool):
    pool, worker, clock = scripted_pool
    worker.answer = WorkerLoad(running=1, output_tokens_per_s=0.0)
    await answered(pool, worker.answer)
    lease = pool.try_acquire(ADDRESS, 100)
    lease.progress(3)
    assert pool.progressing(ADDRESS)
    clock.advance(60)
    assert not pool.progressing(ADDRESS)
    lease.release()
