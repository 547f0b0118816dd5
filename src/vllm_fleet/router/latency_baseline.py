"""What one latency of a worker's interactive requests is without this router's batch there.

The latency controller (classes.BatchGate) with relative targets cuts batch on a worker when
interactive latency there passes a factor times this baseline, not an absolute number: a slow
machine, a big model or a busy engine is slow with or without batch, and an absolute target
below that cuts batch for slowness batch did not cause (the CPU runs in RESULTS.md: online
alone missed a 1 s TTFT target at its own P99, and the controller cut 20 times in a phase where
no cut could help).

The baseline is a P90, like what it is compared with (a window's P90 of token gaps, a worker's
reported P90s). Samples taken while no batch of this router runs on the worker fill a window of
`window` samples; each full window's P90 moves the baseline a `weight` of the way (an EWMA), so
it follows a change of load over a few windows while one odd window moves it little. A worker's
own report is a P90 of a window already and folds in as one. Samples accumulate across the
short spells without batch (a cut to cap 0), so a worker that batch leaves only briefly still
gets a baseline, later.
"""

from __future__ import annotations

import math


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
