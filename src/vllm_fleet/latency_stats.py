"""When a window of latency samples shows its P90 over a target, beyond sampling noise.

The batch controller (router/classes.py) cuts batch on a worker when interactive latency there
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
