"""Arrival processes: right mean rate and dispersion, reproducible from the seed (no clocks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_fleet.bench.arrivals import ArrivalProcess

N = 20_000


def gaps(process: ArrivalProcess) -> np.ndarray:
    return np.diff(process.times(N))


@pytest.mark.parametrize(("burstiness", "expected_cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_mean_gap_and_coefficient_of_variation(burstiness, expected_cv):
    g = gaps(ArrivalProcess(8.0, burstiness=burstiness, seed=7))
    assert g.mean() == pytest.approx(1 / 8.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(expected_cv, rel=0.08)


def test_first_request_goes_out_at_time_zero_and_times_increase():
    times = ArrivalProcess(2.0, seed=1).times(100)
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)


def test_same_seed_same_schedule_other_seed_other_schedule():
    a = ArrivalProcess(4.0, burstiness=0.5, seed=3).times(500)
    b = ArrivalProcess(4.0, burstiness=0.5, seed=3).times(500)
    c = ArrivalProcess(4.0, burstiness=0.5, seed=4).times(500)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_endless_iterator_matches_fixed_count_beyond_one_chunk():
    process = ArrivalProcess(3.0, seed=5)
    it = process.iter_times(chunk=64)
    streamed = [next(it) for _ in range(300)]
    assert np.allclose(streamed, process.times(300))


def test_infinite_rate_sends_everything_at_once():
    assert np.all(ArrivalProcess(math.inf).times(10) == 0.0)


@pytest.mark.parametrize(("rate", "burstiness"), [(0, 1.0), (-1, 1.0), (1.0, 0.0)])
def test_rejects_impossible_settings(rate, burstiness):
    with pytest.raises(ValueError):
        ArrivalProcess(rate, burstiness=burstiness)
