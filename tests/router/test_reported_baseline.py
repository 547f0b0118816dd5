"""A router whose batch always runs on a worker (a Spark job's) steers by the worker's own
baseline (learnt while no batch at all ran there) and judges the worker's reports by their lower
confidence bounds. Pure (a fake clock), then a worker process (the mock engine) and its Load."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeClock, started_router
from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig

SHARE = lambda: 8  # noqa: E731


def busy_gate(clock: FakeClock) -> BatchGate:
    """Relative targets, absolute ones of 1 s / 200 ms, and batch running since the start."""
    gate = BatchGate(ServiceClassConfig(interactive_ttft_target_ms=1000.0, interactive_itl_target_ms=200.0), clock)
    for token in range(4):
        gate.started("w", token, lambda: None)
    return gate


def test_the_workers_baseline_sets_the_target_of_a_router_that_never_saw_it_without_batch():
    clock = FakeClock()
    gate = busy_gate(clock)
    gate.reported("w", ttft_ms=0, itl_ms=0, ttft_baseline_ms=80.0, itl_baseline_ms=30.0, share=SHARE)
    assert gate.targets("w") == pytest.approx((0.088, 0.033))   # 1.1x the worker's, not 1 s / 200 ms
    # Token gaps at 45 ms beyond doubt: 1.5x without batch, far under the absolute 200 ms.
    gate.reported("w", ttft_ms=0, itl_ms=45.0, itl_floor_ms=45.0, itl_baseline_ms=30.0, share=SHARE)
    assert gate.cuts == 1 and gate.cap("w", 8) == 2


def test_without_a_reported_baseline_the_absolute_targets_stand_in():
    clock = FakeClock()
    gate = busy_gate(clock)
    gate.reported("w", ttft_ms=0, itl_ms=45.0, itl_floor_ms=45.0, share=SHARE)
    assert gate.targets("w") == (1.0, 0.2) and gate.cuts == 0
    gate.reported("w", ttft_ms=0, itl_ms=0, itl_baseline_ms=30.0, share=SHARE)
    assert gate.targets("w")[1] == pytest.approx(0.033)
    gate.reported("w", ttft_ms=0, itl_ms=0, share=SHARE)        # restarted: it knows nothing yet
    assert gate.targets("w") == (1.0, 0.2)


def test_a_report_is_judged_by_its_lower_bound_not_its_p90():
    clock = FakeClock()
    gate = busy_gate(clock)
    # The window's P90 is over 1.1 x 30 ms, but its lower bound is not: as often as noise does it.
    gate.reported("w", ttft_ms=0, itl_ms=40.0, itl_floor_ms=31.0, itl_baseline_ms=30.0, share=SHARE)
    assert gate.cuts == 0
    clock.now += BatchGate.REPORTED_EVERY_S
    gate.reported("w", ttft_ms=0, itl_ms=40.0, itl_floor_ms=36.0, itl_baseline_ms=30.0, share=SHARE)
    assert gate.cuts == 1


async def stream(router: Router, rid: str, service_class: str, max_tokens: int) -> None:
    request = build_request(rid, [GenerateInput(text=f"question {rid}")], SamplingParams(max_tokens=max_tokens),
                            service_class=service_class)
    async with router.stream(request) as chunks:
        async for _ in chunks:
            pass


async def test_the_worker_learns_without_batch_and_a_router_whose_batch_never_leaves_uses_it(
        mock_worker_factory):
    # The mock gives a token every 50 ms (20 tokens/s) whatever runs beside it.
    worker = await mock_worker_factory.start(max_num_seqs=8, mock_tokens_per_s=20, mock_ttft_ms=1)
    config = RouterConfig(load_poll_interval_s=0.1, health_poll_interval_s=0.2,
                          classes=ServiceClassConfig(interactive_ttft_target_ms=1000.0, interactive_itl_target_ms=200.0))
    async with started_router([worker.address], config) as executor, \
            started_router([worker.address], config) as gateway, WorkerClient(worker.address) as client:
        # Chat beside a batch row: its gaps are in the recent P90, not in the baseline.
        row = asyncio.create_task(stream(executor, "row-1", "batch", max_tokens=120))
        await wait_until(lambda: executor.snapshot().get(worker.address).batch_in_flight == 1, timeout=30,
                         message="the batch row runs")
        await stream(gateway, "chat-1", "interactive", max_tokens=40)
        load = await client.load()
        assert load.interactive_itl_p90_ms > 0 and load.interactive_itl_baseline_ms == 0
        await row
        # Chat with no batch on the worker teaches it: 40 gaps fill a window of 30.
        await stream(gateway, "chat-2", "interactive", max_tokens=40)
        load = await client.load()
        assert 40 <= load.interactive_itl_baseline_ms <= 150  # ~50 ms: the mock's pace, plus a busy machine's delays
        # A router whose batch runs there now takes the worker's baseline for its target.
        row = asyncio.create_task(stream(executor, "row-2", "batch", max_tokens=60))
        await wait_until(lambda: executor._batch.targets(worker.address)[1] != 0.2, timeout=30,
                         message="the executor took the worker's baseline")
        assert executor._batch.targets(worker.address)[1] == pytest.approx(
            1.1 * executor._batch.baseline(worker.address)[1])
        assert executor._batch.baseline(worker.address)[1] == pytest.approx(
            load.interactive_itl_baseline_ms / 1000, rel=0.5)
        await row
