"""Circuit breaker, outlier ejection and retry budget, on a fake clock."""

from __future__ import annotations

from fakes import FakeClock
from vllm_fleet.router.pool.breaker import CircuitBreaker
from vllm_fleet.router.budget import RetryBudget
from vllm_fleet.router.pool.ejection import OutlierDetector


def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=3, open_s=5.0, success_threshold=2, clock=clock)


def half_open(clock: FakeClock) -> CircuitBreaker:
    """A breaker opened by three failures, then left open for its open time."""
    b = breaker(clock)
    for _ in range(3):
        b.record_failure()
    clock.advance(5.0)
    return b


def test_breaker_opens_after_consecutive_failures_only():
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(5):  # failures interleaved with successes never open it
        b.record_failure(); b.record_failure(); b.record_success()
    assert b.state == "closed" and b.allow()
    b.record_failure(); b.record_failure(); b.record_failure()
    assert b.state == "open" and not b.allow()
    assert b.retry_after() == 5.0


def test_breaker_half_open_admits_one_probe_and_closes_after_successes():
    b = half_open(FakeClock())
    assert b.state == "half_open"
    assert b.allow() and not b.allow()  # one probe at a time
    b.record_success()
    assert b.state == "half_open" and b.allow()
    b.record_success()
    assert b.state == "closed"


def test_breaker_reopens_when_the_probe_fails_and_a_cancelled_probe_frees_the_slot():
    clock = FakeClock()
    b = half_open(clock)
    assert b.allow()
    b.release()           # the client went away: no verdict, the next request may probe
    assert b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow()
    clock.advance(4.9)
    assert b.state == "open"


def test_outlier_ejection_catches_a_worker_that_fails_every_other_request():
    clock = FakeClock()
    d = OutlierDetector(failure_ratio=0.5, min_requests=10, window_s=30, base_ejection_s=10, max_ratio=0.5, clock=clock)
    group = ["a", "b"]
    ejected = False
    for i in range(10):
        ejected = d.record("a", ok=i % 2 == 0, group=group) or ejected
    assert ejected and d.is_ejected("a")
    clock.advance(10.1)
    assert not d.is_ejected("a")
    for i in range(10):  # a repeat offender stays out twice as long
        d.record("a", ok=i % 2 == 0, group=group)
    clock.advance(10.1)
    assert d.is_ejected("a")


def test_outlier_ejection_never_takes_out_more_than_its_share():
    d = OutlierDetector(min_requests=2, max_ratio=0.5, clock=FakeClock())
    for address in ("a", "b"):
        for _ in range(3):
            d.record(address, ok=False, group=["a", "b"])
    assert d.is_ejected("a") != d.is_ejected("b")


def test_outlier_ejection_ignores_failures_outside_the_window():
    clock = FakeClock()
    d = OutlierDetector(min_requests=4, window_s=30, clock=clock)
    for _ in range(3):
        d.record("a", ok=False, group=["a", "b", "c"])
    clock.advance(31)
    assert not d.record("a", ok=False, group=["a", "b", "c"])


def test_retry_budget_allows_ratio_of_requests_plus_floor():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=0.5, window_s=10, clock=clock)  # floor: 5 per window
    for _ in range(100):
        budget.record_request()
    spent = 0
    while budget.try_spend():
        spent += 1
    assert spent == 25  # 0.2 * 100 + 5


def test_retry_budget_recovers_as_the_window_slides():
    clock = FakeClock()
    budget = RetryBudget(ratio=0.0, min_per_s=0.3, window_s=10, clock=clock)  # floor: 3 per window
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    clock.advance(10)
    assert budget.try_spend()


def test_a_breaker_without_room_to_open_stays_closed_and_opens_once_there_is():
    b = breaker(FakeClock())
    for _ in range(5):
        b.record_failure(may_open=False)
    assert b.state == "closed" and b.allow()
    b.record_failure(may_open=True)
    assert b.state == "open"


def test_a_failed_probe_without_room_frees_the_probe_slot():
    b = half_open(FakeClock())
    assert b.allow()
    b.record_failure(may_open=False)
    assert b.state == "half_open" and b.allow()


def test_outlier_ejection_counts_workers_out_by_their_breaker():
    d = OutlierDetector(min_requests=2, max_ratio=0.5, clock=FakeClock())
    for _ in range(3):
        d.record("a", ok=False, group=["a", "b"], out=lambda address: address == "b")
    assert not d.is_ejected("a")


def test_retry_budget_shrinks_with_its_headroom():
    budget = RetryBudget(ratio=0.2, min_per_s=0.5, window_s=10, clock=FakeClock())
    for _ in range(100):
        budget.record_request()
    spent = 0
    while budget.try_spend(headroom=0.2):
        spent += 1
    assert spent == 5  # 0.2 * (0.2 * 100 + 5)
