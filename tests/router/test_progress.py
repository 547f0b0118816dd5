"""What the pool counts as a worker's progress (what keeps a waiting stream on it, watchdog.py):
the worker's own account of its engine stepping, never how long a stream alone has waited, and
never a worker that says it is not serving."""

from __future__ import annotations

import dataclasses

from fakes import POOL_WORKER as ADDRESS
from support import wait_until
from vllm_fleet.protocol.types import WorkerLoad
from vllm_fleet.router.pool.membership import Pool

LIMIT_S = 5.0


async def answered(pool: Pool, load: WorkerLoad) -> None:
    """Until the pool took `load`. These Loads carry no health, so the pool's copy has the health
    service's status filled in."""
    def taken() -> bool:
        current = pool.worker(ADDRESS).load
        return current is not None and dataclasses.replace(current, health=load.health) == load

    await wait_until(taken, timeout=5, message="the new Load answer")


async def test_a_busy_engine_that_steps_is_progress_even_with_no_output_tokens(scripted_pool):
    """Overload: long prompts queue and prefill, nothing decodes for a while. The engine steps
    (engine_silent_s 0), so the requests it queues are waiting, not stuck (issue #50)."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, waiting=40, output_tokens_per_s=0.0, engine_silent_s=0.0)
    await answered(pool, worker.answer)
    assert pool.progressing(ADDRESS, LIMIT_S)
    assert pool.progressing(ADDRESS, 0.1)


async def test_held_requests_on_a_silent_engine_are_not_progress(scripted_pool):
    """A wedged engine keeps reporting the requests it holds; its silence gives it away."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, waiting=3, output_tokens_per_s=0.0, engine_silent_s=LIMIT_S + 1)
    await answered(pool, worker.answer)
    assert not pool.progressing(ADDRESS, LIMIT_S)


async def test_a_silence_shorter_than_the_streams_limit_is_still_progress(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=2, engine_silent_s=3.0)
    await answered(pool, worker.answer)
    assert pool.progressing(ADDRESS, LIMIT_S)
    assert not pool.progressing(ADDRESS, 2.0)


async def test_a_worker_that_says_not_serving_is_not_progressing_whatever_its_load(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=16, output_tokens_per_s=120.0)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert not pool.progressing(ADDRESS, LIMIT_S)


async def test_a_draining_worker_whose_engine_steps_is_progressing(scripted_pool):
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(running=4, output_tokens_per_s=50.0, draining=True)
    await answered(pool, worker.answer)
    worker.status = "NOT_SERVING"
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    assert pool.progressing(ADDRESS, LIMIT_S)


async def test_an_old_silence_report_does_not_decide_once_the_load_is_stale(scripted_pool):
    """With no fresh Load (its push stream broke) the worker's health answer decides."""
    pool, worker, clock = scripted_pool
    worker.answer = WorkerLoad(running=1, engine_silent_s=LIMIT_S + 1)
    await answered(pool, worker.answer)
    assert not pool.progressing(ADDRESS, LIMIT_S)
    worker.load_fails = True  # Loads get no answer; health still answers SERVING
    clock.advance(60)
    assert pool.worker(ADDRESS).health == "SERVING"
    assert pool.progressing(ADDRESS, LIMIT_S)
