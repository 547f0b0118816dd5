"""Key buckets shared by the processes of one `gateway --processes N`: a key's limit holds for
all of them together. Two KeyLimiters over one bucket file stand for two processes (each opens
the file itself, as each forked process does); the last test uses real forked processes."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from fakes import FakeClock
from vllm_fleet.errors import RateLimitedError
from vllm_fleet.router.quota.key_limiter import KeyLimiter
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.quota.shared_buckets import SharedBucketFile


def limiters(path, config: AdmissionConfig, clock) -> tuple[KeyLimiter, KeyLimiter]:
    return KeyLimiter(config, clock, SharedBucketFile(path)), KeyLimiter(config, clock, SharedBucketFile(path))


def test_two_processes_share_one_requests_per_minute_limit(tmp_path):
    clock = FakeClock()
    first, second = limiters(tmp_path / "buckets", AdmissionConfig(default=KeyLimits(requests_per_min=3)), clock)
    first.reserve("team", 1)
    second.reserve("team", 1)
    first.reserve("team", 1)
    for limiter in (first, second):
        with pytest.raises(RateLimitedError) as info:
            limiter.reserve("team", 1)
        assert info.value.reason == "requests_per_min" and info.value.retry_after == pytest.approx(20.0)
    second.reserve("other", 1)  # other keys have their own slot
    clock.advance(20)
    second.reserve("team", 1)
    with pytest.raises(RateLimitedError):
        first.reserve("team", 1)


def test_tokens_settled_by_one_process_come_back_for_the_other(tmp_path):
    clock = FakeClock()
    first, second = limiters(tmp_path / "buckets", AdmissionConfig(default=KeyLimits(tokens_per_min=1000)), clock)
    first.reserve("k", 600)
    with pytest.raises(RateLimitedError):
        second.reserve("k", 600)
    first.settle("k", reserved=600, used=100)
    second.reserve("k", 600)


def test_a_reload_in_every_process_resizes_the_shared_bucket_once(tmp_path):
    clock = FakeClock()
    first, second = limiters(tmp_path / "buckets", AdmissionConfig(default=KeyLimits(requests_per_min=4)), clock)
    for _ in range(3):
        first.reserve("k", 1)
    second.reserve("k", 1)  # both processes know the key when the reload comes
    raised = AdmissionConfig(default=KeyLimits(requests_per_min=6))
    first.update(raised)  # SIGHUP reaches every process; each applies the new limit
    second.update(raised)
    # 4 of the 6 are used: 2 more, not 2 per process and not a free refill.
    first.reserve("k", 1)
    second.reserve("k", 1)
    with pytest.raises(RateLimitedError):
        first.reserve("k", 1)


def test_a_limit_turned_on_by_a_reload_starts_full_and_shared(tmp_path):
    clock = FakeClock()
    first, second = limiters(tmp_path / "buckets", AdmissionConfig(), clock)
    first.reserve("k", 1)  # no limit yet
    second.reserve("k", 1)
    limited = AdmissionConfig(default=KeyLimits(requests_per_min=2))
    first.update(limited)
    second.update(limited)
    first.reserve("k", 1)
    second.reserve("k", 1)
    with pytest.raises(RateLimitedError):
        first.reserve("k", 1)


def test_a_full_table_falls_back_to_this_process_buckets(tmp_path):
    config = AdmissionConfig(default=KeyLimits(requests_per_min=1))
    keys = KeyLimiter(config, FakeClock(), SharedBucketFile(tmp_path / "buckets", slots=1))
    keys.reserve("a", 1)
    keys.reserve("b", 1)  # no slot left: limited by this process alone, still limited
    with pytest.raises(RateLimitedError):
        keys.reserve("b", 1)


def _admit_all_you_can(path: str, attempts: int, start, admitted) -> None:
    keys = KeyLimiter(AdmissionConfig(default=KeyLimits(requests_per_min=100)), time.monotonic, SharedBucketFile(path))
    start.wait()
    count = 0
    for _ in range(attempts):
        try:
            keys.reserve("burst", 1)
            count += 1
        except RateLimitedError:
            pass
    with admitted.get_lock():
        admitted.value += count


def test_forked_processes_racing_for_one_key_admit_its_limit_exactly(tmp_path):
    context = multiprocessing.get_context("fork")
    start, admitted = context.Event(), context.Value("i", 0)
    path = str(tmp_path / "buckets")
    racers = [context.Process(target=_admit_all_you_can, args=(path, 2000, start, admitted)) for _ in range(4)]
    began = time.monotonic()
    for racer in racers:
        racer.start()
    start.set()
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0
    refill = (time.monotonic() - began) * 100 / 60  # what the bucket earned while they raced
    assert 100 <= admitted.value <= 100 + refill + 1, (admitted.value, refill)
