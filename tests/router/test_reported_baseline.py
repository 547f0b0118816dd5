"""A router whose batch always runs on a worker (a Spark job's) steers by the worker's own
baseline (learnt while no batch at all ran there) and judges the worker's reports by their lower
confidence bounds. Pure: a fake clock."""

from __future__ import annotations

import pytest
from fakes import FakeClock
from vllm_fleet.router.classes import BatchGate, ServiceClassConfig

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
