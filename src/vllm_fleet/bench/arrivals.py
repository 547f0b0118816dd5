"""When requests are sent: open-loop arrival processes, seeded and independent of the clock.

An open-loop load generator sends request k at a planned time whatever happened to the
requests before it, which is how independent users behave; a closed loop (a fixed number of
users each waiting for its answer) hides queueing delay and is handled by the runner.

Inter-arrival gaps follow a gamma distribution with shape `burstiness` and mean `1/rate`:
shape 1 is the exponential distribution (a Poisson process, coefficient of variation 1);
shape < 1 gives bursts (CV = 1/sqrt(shape) > 1); shape > 1 smooths arrivals towards a
fixed pace. The schedule is a pure function of (rate, burstiness, seed), so tests check the
distribution without ever timing anything.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np


class ArrivalProcess:
    """Planned send times (seconds from the start) at `rate` requests/s.

    `rate=math.inf` sends everything at time 0 (a burst, useful to measure peak throughput).
    """

    def __init__(self, rate: float, *, burstiness: float = 1.0, seed: int = 0) -> None:
        if not rate > 0:
            raise ValueError(f"arrival rate must be > 0 requests/s, got {rate}")
        if not burstiness > 0:
            raise ValueError(f"burstiness (gamma shape) must be > 0, got {burstiness}")
        self.rate = rate
        self.burstiness = burstiness
        self.seed = seed

    def times(self, count: int) -> np.ndarray:
        """Planned send times of the first `count` requests, starting at 0."""
        return np.fromiter(itertools.islice(self.iter_times(), count), dtype=float, count=count)

    def iter_times(self, *, chunk: int = 1024) -> Iterator[float]:
        """Planned send times without an end (duration-bound runs stop reading when time is up).

        The run starts with a request, not with an idle gap: the first time is 0.
        """
        rng = np.random.default_rng(self.seed)
        scale = 0.0 if math.isinf(self.rate) else 1.0 / (self.rate * self.burstiness)
        now = 0.0
        yield now
        while True:
            for gap in rng.gamma(shape=self.burstiness, scale=scale, size=chunk):
                now += float(gap)
                yield now


def describe(rate: float, burstiness: float) -> str:
    if math.isinf(rate):
        return "all at once"
    kind = "Poisson" if burstiness == 1.0 else f"gamma(shape={burstiness:g})"
    return f"{rate:g} req/s {kind}"
