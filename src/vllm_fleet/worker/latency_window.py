"""The interactive latency this worker sees, as every router's batch controller needs it.

The latency controller (router/classes.py) halves a worker's batch cap when interactive work
there misses its TTFT or ITL target. A router sees only its own streams, and a Spark executor's
router carries no interactive traffic at all, so it would never back off for the gateway's chat
users. The worker sees every stream: it keeps the recent first-token times and per-token gaps
of its interactive (not batch) requests and reports their P90 in each Load.

Times are from the engine's outputs as they reach the worker (before coalescing), so they are
the engine's step times plus queueing, not the network's. Samples older than `window_s` are
dropped; the bound on samples keeps a busy worker's memory and Load cost flat.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 2.0
MAX_SAMPLES = 2048


class LatencyWindow:
    def __init__(self, window_s: float = WINDOW_S, max_samples: int = MAX_SAMPLES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (when, seconds)
        self._itl: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def first_token(self, seconds: float) -> None:
        self._ttft.append((self._clock(), seconds))

    def tokens(self, gap_s: float, count: int) -> None:
        """`count` tokens arrived `gap_s` after the stream's previous ones."""
        if count > 0:
            self._itl.append((self._clock(), gap_s / count))

    def ttft_p90_ms(self) -> float:
        return self._p90_ms(self._ttft)

    def itl_p90_ms(self) -> float:
        return self._p90_ms(self._itl)

    def _p90_ms(self, samples: deque[tuple[float, float]]) -> float:
        horizon = self._clock() - self.window_s
        while samples and samples[0][0] < horizon:
            samples.popleft()
        if not samples:
            return 0.0
        values = sorted(value for _, value in samples)
        return values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)] * 1000
