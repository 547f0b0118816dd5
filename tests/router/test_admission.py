"""Admission: key buckets and class queues, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from fakes import FakeClock
from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.quota.admission import Admission, ClassQueue
from vllm_fleet.router.quota.key_limiter import KeyLimiter, TokenBucket
from vllm_fleet.router.config import AdmissionConfig, KeyLimits


def test_token_bucket_refills_at_its_rate_and_reports_the_wait():
    clock = FakeClock()
    bucket = TokenBucket(60, clock)  # one per second
    bucket.take(60)
    assert bucket.wait_for(3) == pytest.approx(3.0)
    clock.advance(2)
    assert bucket.wait_for(3) == pytest.approx(1.0)
    clock.advance(100)
    assert bucket.level == 60  # never above capacity


def test_key_requests_per_minute_refuses_the_excess_with_an_honest_retry_after():
    clock = FakeClock()
    keys = KeyLimiter(AdmissionConfig(default=KeyLimits(requests_per_min=3)), clock)
    for _ in range(3):
        keys.reserve("abusive", 10)
    with pytest.raises(RateLimitedError) as info:
        keys.reserve("abusive", 10)
    assert info.value.reason == "requests_per_min"
    assert info.value.retry_after == pytest.approx(20.0)
    keys.reserve("polite", 10)  # other keys are unaffected
    clock.advance(20)
    keys.reserve("abusive", 10)


def test_key_token_reservation_is_settled_with_real_usage():
    clock = FakeClock()
    keys = KeyLimiter(AdmissionConfig(default=KeyLimits(tokens_per_min=1000)), clock)
    keys.reserve("k", 600)
    with pytest.raises(RateLimitedError) as info:
        keys.reserve("k", 600)
    assert info.value.reason == "tokens_per_min" and "max_tokens" in str(info.value)
    keys.settle("k", reserved=600, used=100)  # only 100 were used: 500 come back
    keys.reserve("k", 600)
    keys.settle("k", reserved=600, used=900)  # the estimate was low: the key goes into debt
    with pytest.raises(RateLimitedError):
        keys.reserve("k", 1)


def test_per_key_override_beats_the_default():
    config = AdmissionConfig(default=KeyLimits(requests_per_min=1), keys={"vip": KeyLimits(requests_per_min=100)})
    keys = KeyLimiter(config, FakeClock())
    for _ in range(50):
        keys.reserve("vip", 1)
    keys.reserve("anon", 1)
    with pytest.raises(RateLimitedError):
        keys.reserve("anon", 1)


def test_a_request_larger_than_the_whole_bucket_fits_when_the_bucket_is_full():
    """A request reserving more than a minute's tokens is never refused forever: it waits only
    until the bucket is full (not for its own size), runs then, and the key's debt then holds
    back what follows until it is paid."""
    clock = FakeClock()
    keys = KeyLimiter(AdmissionConfig(default=KeyLimits(tokens_per_min=100)), clock)
    keys.reserve("k", 10)  # 90 of 100 left: the bucket is not full
    with pytest.raises(RateLimitedError) as info:
        keys.reserve("k", 5000)
    assert info.value.reason == "tokens_per_min"
    assert info.value.retry_after == pytest.approx(10 * 60 / 100)  # until full again, not 5,000 tokens' worth
    clock.advance(10 * 60 / 100)
    keys.reserve("k", 5000)  # the bucket is full: admitted (reserve raises when it refuses), 4,900 in debt
    with pytest.raises(RateLimitedError) as info:
        keys.reserve("k", 1)
    assert info.value.retry_after == pytest.approx(4901 * 60 / 100)  # the debt, then one token, at 100/min
    clock.advance(4901 * 60 / 100)
    keys.reserve("k", 1)  # the debt is paid: admitted
    keys.reserve("other", 5000)  # other keys have their own bucket, full: admitted


def test_secret_keys_are_not_echoed_in_errors():
    keys = KeyLimiter(AdmissionConfig(default=KeyLimits(requests_per_min=1)), FakeClock())
    secret = "sk-very-secret-key-123456"
    keys.reserve(secret, 1)
    with pytest.raises(RateLimitedError) as info:
        keys.reserve(secret, 1)
    assert secret not in str(info.value)


async def test_class_queue_waits_for_a_slot_in_order():
    queue = ClassQueue("short", max_in_flight=1, queue_size=2)
    await queue.acquire(1.0)
    order = []

    async def waiter(name):
        await queue.acquire(30.0)
        order.append(name)

    tasks = [asyncio.create_task(waiter("first")), asyncio.create_task(waiter("second"))]
    while queue.depth < 2:
        await asyncio.sleep(0)
    with pytest.raises(RateLimitedError) as info:
        await queue.acquire(1.0)
    assert info.value.reason == "queue_full"
    queue.release()
    await tasks[0]
    assert order == ["first"] and queue.depth == 1
    queue.release()
    await tasks[1]
    assert order == ["first", "second"] and queue.in_flight == 1


async def test_class_queue_times_out_and_a_cancelled_waiter_leaves_no_trace():
    queue = ClassQueue("long", max_in_flight=1, queue_size=5)
    await queue.acquire(1.0)
    with pytest.raises(RateLimitedError) as info:
        await queue.acquire(0.01)
    assert info.value.reason == "queue_timeout"
    task = asyncio.create_task(queue.acquire(30.0))
    while queue.depth < 1:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queue.depth == 0
    queue.release()
    assert queue.in_flight == 0


async def test_admission_refunds_the_key_when_the_queue_refuses():
    config = AdmissionConfig(default=KeyLimits(requests_per_min=2), short_max_in_flight=1, short_queue_size=0)
    admission = Admission(config, FakeClock())
    ticket = await admission.admit(key="k", workload_class="short", tokens=10, timeout=None)
    with pytest.raises(RateLimitedError) as info:
        await admission.admit(key="k", workload_class="short", tokens=10, timeout=None)
    assert info.value.reason == "queue_full"
    ticket.finish(10)
    await admission.admit(key="k", workload_class="short", tokens=10, timeout=None)  # the refused one was refunded
