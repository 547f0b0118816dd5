"""The one percentile the benchmarks share: linear between ranks, like the bench reports."""

from __future__ import annotations

import math

from vllm_fleet.bench import percentile
from vllm_fleet.bench.metrics import distribution


def test_percentile_interpolates_between_ranks_in_the_values_unit():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert math.isclose(percentile(iter([0.010, 0.020]), 99), 0.0199)


def test_percentile_agrees_with_the_bench_report():
    ttfts = [0.003 * i for i in range(1, 101)]
    assert math.isclose(percentile(ttfts, 99) * 1e3, distribution(ttfts)["p99"])


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 99))
