"""Latency statistics the batch controller and the worker share: a baseline, and when a window of
samples shows its P90 over a target beyond sampling noise.

**The baseline**: what one latency of a worker's interactive requests is without batch there.

The latency controller (batch_gate.BatchGate) with relative targets cuts batch on a worker when
interactive latency there passes a factor times this baseline, not an absolute number: a slow
machine, a big model or a busy engine is slow with or without batch, and an absolute target
below that cuts batch for slowness batch did not cause (the CPU runs in RESULTS.md: online
alone missed a 1 s TTFT target at its own P99, and the controller cut 20 times in a phase where
no cut could help).

Two learn it: the worker itself, from samples taken while no batch request at all ran on it
(worker/latency_window.py, reported in its Load), and each router, from its own samples while
none of *its* batch ran there (the fallback for a worker that reports none). The worker's is
the better one: it sees every router's batch, and a Spark executor's router, whose batch always
runs, never learns one of its own.

The baseline is a P90, like what it is compared with (a window's P90 of token gaps, a worker's
reported P90s). Samples taken while no batch runs on the worker fill a window of
`window` samples; each full window's P90 moves the baseline a `weight` of the way (an EWMA), so
it follows a change of load over a few windows while one odd window moves it little. A worker's
own report is a P90 of a window already and folds in as one. Samples accumulate across the
short spells without batch (a cut to cap 0), so a worker that batch leaves only briefly still
gets a baseline, later.

**A miss beyond noise.**

The batch controller (router/classes/batch_gate.py) cuts batch on a worker when interactive latency there
misses a target, and a relative target is 1.1x a P90: by definition about one sample in ten is
over the P90, so "one slow sample" or "a window's P90 over target" fires on noise alone. On the
H200 (2026-12-03) that held a Batch API job to 33% of the idle capacity while online latency
stayed at 0.99x alone: a cut every few seconds for slowness batch did not cause.

The test here is one-sided on the share of samples over the target: with the true share at
10% (the P90 exactly on target), the count over target among n samples is Binomial(n, 0.1);
a miss needs more than its mean plus `MISS_Z` standard deviations. With z = 2 a window whose
P90 is on target reads as a miss about 2% of the time, and a real step (most samples slow) is
caught from its first few samples. One sample alone that is over target still is a miss (1 > 0.7),
so a lone slow request on an idle worker is still heard.
"""

from __future__ import annotations

import math

OVER_SHARE = 0.1  # the P90: a tenth of the samples may be over it
MISS_Z = 2.0


def significant_over(n: int) -> int:
    """The fewest of `n` samples over a target that show the P90 over it (n >= 1)."""
    mean = OVER_SHARE * n
    return math.floor(mean + MISS_Z * math.sqrt(n * OVER_SHARE * (1 - OVER_SHARE))) + 1


def confident_p90(samples: list[float]) -> float:
    """The highest level that `significant_over(len(samples))` of the samples exceed (a lower
    confidence bound on the P90, at the same z): a target under it is a significant miss, the
    same verdict `significant_over` gives a router that holds the samples itself."""
    ordered = sorted(samples)
    # The value with `significant_over(n)` samples at or above it; a target strictly below it has
    # that many over it. With too few samples for any verdict (never, for z = 2), the smallest.
    return ordered[max(0, len(ordered) - significant_over(len(ordered)))]


def p90(samples: list[float]) -> float:
    """The 90th percentile at rank 0.9 x (n + 1), between two samples where it falls between.
    Not the nearest rank: of 10 samples that is the 9th, on average the 82nd percentile, and a
    baseline that low makes 1.1x it a target that latency without batch passes often."""
    ordered = sorted(samples)
    rank = 0.9 * (len(ordered) + 1)
    if rank <= 1:
        return ordered[0]
    if rank >= len(ordered):
        return ordered[-1]
    below = math.floor(rank)
    return ordered[below - 1] + (rank - below) * (ordered[below] - ordered[below - 1])


class LatencyBaseline:
    """EWMA of windowed P90s of one latency (seconds); None until the first window is full."""

    def __init__(self, window: int, weight: float = 0.25) -> None:
        self.window = window
        self.weight = weight
        self.value: float | None = None
        self._samples: list[float] = []

    def add(self, sample_s: float) -> None:
        self._samples.append(sample_s)
        if len(self._samples) >= self.window:
            self.fold(p90(self._samples))
            self._samples.clear()

    def fold(self, p90_s: float) -> None:
        """One window's P90 (a full window of ours, or a worker's report)."""
        self.value = p90_s if self.value is None else self.value + self.weight * (p90_s - self.value)
