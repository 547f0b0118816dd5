"""The pool's polls cost the gateway a unary gRPC call each (about a millisecond of CPU), so its
one source of Loads (WorkerClient.loads, the rule in client/loads.py) skips those another answer
already covers: a Load the worker pushes or attached to a stream call stands for a Load poll, and
a fresh Load that carries the worker's health status stands for a health check. A failed request
still asks the worker itself at once, and a worker whose pushes stop is polled again."""

from __future__ import annotations

from fakes import POOL_WORKER as ADDRESS
from support import wait_until
from vllm_fleet.protocol.types import WorkerLoad


async def test_a_load_that_carries_health_stands_for_the_health_check(scripted_pool):
    pool, worker, _ = scripted_pool
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


async def test_a_stale_load_does_not_stand_for_the_health_check(scripted_pool):
    """A worker that stopped answering Loads is asked the usual way."""
    pool, worker, clock = scripted_pool
    worker.answer = WorkerLoad(health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.answer, timeout=5, message="the Load answer")
    worker.load_fails = True
    loads = worker.load_calls
    await wait_until(lambda: worker.load_calls > loads, timeout=5, message="a failed Load poll")
    clock.advance(1.0)  # the last answer is now fifty intervals old
    checks = worker.health_calls
    await wait_until(lambda: worker.health_calls >= checks + 2, timeout=5, message="health checks again")


async def test_without_health_in_the_load_the_health_check_stays(scripted_pool):
    """Workers that predate the field answer Loads without it."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad()
    checks = worker.health_calls
    await wait_until(lambda: worker.health_calls >= checks + 3, timeout=5, message="health checks")


async def test_a_failed_request_asks_the_worker_itself(scripted_pool):
    pool, worker, _ = scripted_pool
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


async def test_a_load_streamed_by_the_worker_stands_for_the_load_poll(scripted_pool):
    pool, worker, _ = scripted_pool
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


async def test_a_worker_that_pushes_its_load_gets_no_polls_at_all(scripted_pool):
    """An idle gateway asks each serving worker to push its Load, and then polls nothing."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.answer, timeout=5, message="the Load answer")
    pushed = WorkerLoad(running=2, health="SERVING")
    worker.pushing = pushed
    await wait_until(lambda: pool.worker(ADDRESS).load is pushed, timeout=5, message="the pushed Load taken")
    assert worker.push_asked_every == pool.config.load_poll_interval_s
    polls, checks, turns = worker.load_calls, worker.health_calls, pool.worker(ADDRESS).loads
    await wait_until(lambda: pool.worker(ADDRESS).loads >= turns + 10, timeout=5, message="ten pushed Loads")
    assert (worker.load_calls, worker.health_calls) == (polls, checks)
    # A worker that stops pushing (an older one took its place) is polled again.
    worker.pushing = None
    await wait_until(lambda: worker.load_calls > polls, timeout=5, message="a Load poll again")


async def test_pushes_that_stop_coming_make_the_source_poll(scripted_pool):
    """A worker that says it pushes but sends nothing (its call hung) is polled once a push is late."""
    pool, worker, _ = scripted_pool
    worker.pushing = WorkerLoad(running=2, health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.pushing, timeout=5, message="the pushed Load")
    polls = worker.load_calls
    worker.answer = polled = WorkerLoad(running=3, health="SERVING")
    worker.push_stalled = True
    await wait_until(lambda: pool.worker(ADDRESS).load is polled, timeout=5, message="a polled Load")
    assert worker.pushes_late >= 1 and worker.load_calls > polls


async def test_a_failed_request_asks_the_worker_itself_without_waiting_for_its_push(scripted_pool):
    """A dead worker leaves rotation in one round trip, not after a push it waits for runs late."""
    pool, worker, _ = scripted_pool
    worker.pushing = WorkerLoad(running=2, health="SERVING")
    await wait_until(lambda: pool.worker(ADDRESS).load is worker.pushing, timeout=5, message="the pushed Load")
    worker.push_stalled = True  # the worker died mid-call, and the call has not noticed yet
    waits = worker.push_waits
    await wait_until(lambda: worker.push_waits > waits, timeout=5, message="a wait for a push that never comes")
    worker.status, worker.load_fails = "UNREACHABLE", True
    checks = worker.health_calls
    pool.report(ADDRESS, False)
    await wait_until(lambda: pool.worker(ADDRESS).health == "UNREACHABLE", timeout=5, message="UNREACHABLE seen")
    assert worker.health_calls > checks
    assert worker.pushes_late == 0, "the check waited for the push to run late"


async def test_a_worker_that_is_not_serving_is_polled_rather_than_asked_to_push(scripted_pool):
    """A stream call to a worker that is down would fail anew every turn; its Load call says when it serves."""
    pool, worker, _ = scripted_pool
    worker.answer = WorkerLoad(health="NOT_SERVING", draining=True)
    worker.pushing = WorkerLoad(health="NOT_SERVING", draining=True)  # it began to drain
    await wait_until(lambda: pool.worker(ADDRESS).health == "NOT_SERVING", timeout=5, message="NOT_SERVING seen")
    polls, waits = worker.load_calls, worker.push_waits
    await wait_until(lambda: worker.load_calls >= polls + 5, timeout=5, message="Load polls")
    assert worker.push_waits == waits
    worker.answer = WorkerLoad(health="SERVING")  # it serves again: pushes take over
    await wait_until(lambda: worker.push_waits > waits, timeout=5, message="a wait for a push again")
