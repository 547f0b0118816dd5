"""Failures never empty the pool (issue #50): breakers and ejection together take out at most
their share of a model's workers, never its last one; when every worker is out anyway, requests
go to them (panic mode) rather than being refused; and retries shrink as the pool saturates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from prometheus_client import CollectorRegistry

from fakes import ScriptedWorkerClient, addresses
from support import wait_until
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import Chunk, GenerateRequest, Usage, WorkerLoad
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.pool.membership import MIN_RETRY_HEADROOM, Pool

FAST = dict(load_poll_interval_s=0.02, health_poll_interval_s=0.02)


class Workers:
    """Every worker answers Load and health as one scripted client; each attempt either fails with
    UNAVAILABLE (while `failing`) or streams a two-token answer."""

    def __init__(self) -> None:
        self.scripted = ScriptedWorkerClient("any")
        self.failing = True
        self.attempts: list[str] = []
        self.metrics = CollectorRegistry()

    def get(self, address: str) -> ScriptedWorkerClient:
        return self.scripted

    def connect(self, address: str) -> Workers._Attempt:
        return Workers._Attempt(self, address)

    class _Attempt:
        def __init__(self, workers: Workers, address: str) -> None:
            self.workers, self.address = workers, address

        async def generate(self, request: GenerateRequest, *, timeout: float | None = None) -> AsyncIterator[Chunk]:
            self.workers.attempts.append(self.address)
            if self.workers.failing:
                raise WorkerUnavailableError(f"worker {self.address} failed", worker=self.address)
            yield Chunk(0, 0, "a", [1])
            yield Chunk(0, 0, "b", [2], finish_reason="length", usage=Usage(prompt_tokens=3, completion_tokens=2))


@asynccontextmanager
async def router_over(count: int, **config) -> AsyncIterator[tuple[Router, Workers]]:
    workers = Workers()
    router = Router(StaticRegistry.from_spec(",".join(addresses(count))), RouterConfig(**FAST, **config),
                    workers, connect=workers.connect, metrics_registry=workers.metrics)
    await router.start()
    try:
        await wait_until(lambda: len(router.snapshot().eligible()) == count, timeout=10, message="every worker serving")
        yield router, workers
    finally:
        await router.close()


def request(rid: str) -> GenerateRequest:
    return build_request(rid, [GenerateInput(text="hello")], SamplingParams(max_tokens=2))


async def answer(router: Router, rid: str) -> str:
    async with router.stream(request(rid)) as stream:
        return "".join([chunk.text async for chunk in stream])


def counter(workers: Workers, name: str) -> float:
    return workers.metrics.get_sample_value(f"vllm_fleet_router_{name}_total") or 0.0


async def fail_requests(router: Router, count: int) -> None:
    for i in range(count):
        with pytest.raises(WorkerUnavailableError):
            await answer(router, f"failing-{i}")


async def test_a_models_last_worker_is_never_taken_out():
    async with router_over(1, breaker_failures=1, ejection_min_requests=2) as (router, workers):
        await fail_requests(router, 10)
        view = router.snapshot().workers[0]
        assert (view.breaker, view.state) == ("closed", "serving")
        workers.failing = False
        assert await answer(router, "after") == "ab"


async def test_failures_everywhere_take_out_at_most_the_share_of_the_pool():
    async with router_over(2, breaker_failures=1, ejection_min_requests=2, breaker_open_s=600,
                           ejection_base_s=600) as (router, workers):
        await fail_requests(router, 10)
        out = [v for v in router.snapshot() if v.breaker == "open" or v.state == "ejected"]
        assert len(out) == 1, [(v.address, v.breaker, v.state) for v in router.snapshot()]
        workers.failing = False
        answered = [await answer(router, f"after-{i}") for i in range(4)]
        assert answered == ["ab"] * 4
        assert counter(workers, "panics") == 0


async def test_when_every_worker_is_out_requests_still_go_to_one_of_them():
    # The user allowed the whole pool out (max ratio 1): panic mode answers instead of 503.
    async with router_over(2, breaker_failures=1, breaker_open_s=600, ejection_max_ratio=1.0,
                           max_attempts=2) as (router, workers):
        await fail_requests(router, 1)  # one attempt on each worker: both breakers open
        assert all(v.breaker == "open" for v in router.snapshot())
        workers.failing = False
        assert await answer(router, "in-panic") == "ab"
        assert counter(workers, "panics") == 1


async def test_the_retry_budget_shrinks_as_the_pool_saturates():
    worker = ScriptedWorkerClient("any")
    pool = Pool(StaticRegistry.from_spec(",".join(addresses(2))), worker, RouterConfig(**FAST),
                RouterMetrics(CollectorRegistry()))
    await pool.start()
    try:
        await wait_until(lambda: len(pool.snapshot().eligible()) == 2, timeout=10, message="both serving")
        address = addresses(2)[0]
        assert pool.retry_headroom(address) == 1.0
        worker.answer = WorkerLoad(running=8, waiting=20)  # both workers queue
        await wait_until(lambda: all(v.load and v.load.waiting == 20 for v in pool.snapshot()), timeout=5,
                         message="both queues seen")
        assert pool.retry_headroom(address) == pytest.approx(MIN_RETRY_HEADROOM)
    finally:
        await pool.close()


async def test_streams_of_a_worker_that_is_gone_may_use_the_whole_budget_however_saturated():
    """Migration off a dead worker adds no work to the pool (its work died with it): it is not cut
    when the survivors queue, while retries of errors a busy worker answered are."""
    from vllm_fleet.errors import WorkerError, WorkerTimeoutError
    from vllm_fleet.router.retry import retry_headroom

    async with router_over(2) as (router, workers):
        workers.scripted.answer = WorkerLoad(running=8, waiting=20)
        await wait_until(lambda: all(v.load and v.load.waiting == 20 for v in router.snapshot()), timeout=5,
                         message="both queues seen")
        context = router._context  # noqa: SLF001 - what a stream is handed
        address = addresses(2)[0]
        assert retry_headroom(context, WorkerUnavailableError("gone", worker=address), address) == 1.0
        assert retry_headroom(context, WorkerTimeoutError("stalled", worker=address), address) == 1.0
        assert retry_headroom(context, WorkerError("failed (INTERNAL)", worker=address), address) == \
            pytest.approx(MIN_RETRY_HEADROOM)
