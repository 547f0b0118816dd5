"""The interactive latency this worker sees, as every router's batch controller needs it.

The latency controller (router/classes/batch_gate.py) halves a worker's batch cap when interactive work
there misses its TTFT or ITL target. A router sees only its own streams, and a Spark executor's
router carries no interactive traffic at all, so it would never back off for the gateway's chat
users. The worker sees every stream: it keeps the recent first-token times and per-token gaps
of its interactive (not batch) requests and reports, in each Load:

* their P90 over the last `window_s`, and the P90's lower confidence bound
  (latency_stats.confident_p90): the bound is over a target exactly when the window's samples
  show the P90 over it beyond sampling noise, the verdict a router gives its own samples;
* its baseline: the P90 of each latency in the spells when no batch request at all ran here
  (latency_stats.LatencyBaseline), a sample counting only if no batch ran during the time it
  covers (a first token: since its request started; a gap: that gap). Relative targets are
  this times 1.1, so a router whose batch always runs here (a Spark job's) still has one.

Times are from the engine's outputs as they reach the worker (before coalescing), so they are
the engine's step times plus queueing, not the network's. Samples older than `window_s` are
dropped; the bound on samples keeps a busy worker's memory and Load cost flat.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from vllm_fleet.latency_stats import LatencyBaseline, confident_p90

WINDOW_S = 2.0
MAX_SAMPLES = 2048
BASELINE_TTFTS = 10  # a baseline window: this many first tokens without batch...
BASELINE_GAPS = 30   # ...or token gaps (as the router's BatchGate learns its own)


class LatencyWindow:
    def __init__(self, window_s: float = WINDOW_S, max_samples: int = MAX_SAMPLES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (when, seconds)
        self._itl: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self.ttft_baseline = LatencyBaseline(BASELINE_TTFTS)
        self.itl_baseline = LatencyBaseline(BASELINE_GAPS)
        self._batch_running = 0
        self._batch_ended_at = -math.inf  # when the last batch request here ended

    def batch_started(self) -> None:
        self._batch_running += 1

    def batch_ended(self) -> None:
        self._batch_running = max(0, self._batch_running - 1)
        self._batch_ended_at = self._clock()

    def _without_batch(self, now: float, covers_s: float) -> bool:
        """Whether no batch request ran here during the `covers_s` seconds up to `now`."""
        return self._batch_running == 0 and self._batch_ended_at <= now - covers_s

    def first_token(self, seconds: float) -> None:
        now = self._clock()
        self._ttft.append((now, seconds))
        if self._without_batch(now, seconds):
            self.ttft_baseline.add(seconds)

    def tokens(self, gap_s: float, count: int) -> None:
        """`count` tokens arrived `gap_s` after the stream's previous ones."""
        if count > 0:
            now = self._clock()
            self._itl.append((now, gap_s / count))
            if self._without_batch(now, gap_s):
                self.itl_baseline.add(gap_s / count)

    def ttft_p90_ms(self) -> float:
        return self._p90s_ms(self._ttft)[0]

    def itl_p90_ms(self) -> float:
        return self._p90s_ms(self._itl)[0]

    def ttft_p90_floor_ms(self) -> float:
        return self._p90s_ms(self._ttft)[1]

    def itl_p90_floor_ms(self) -> float:
        return self._p90s_ms(self._itl)[1]

    def report(self) -> tuple[float, float, float, float]:
        """(TTFT P90, ITL P90, TTFT floor, ITL floor) in ms, one sort per latency: a Load's share."""
        ttft, itl = self._p90s_ms(self._ttft), self._p90s_ms(self._itl)
        return ttft[0], itl[0], ttft[1], itl[1]

    def ttft_baseline_ms(self) -> float:
        """0: not learnt yet."""
        return (self.ttft_baseline.value or 0.0) * 1000

    def itl_baseline_ms(self) -> float:
        return (self.itl_baseline.value or 0.0) * 1000

    def _p90s_ms(self, samples: deque[tuple[float, float]]) -> tuple[float, float]:
        """The window's nearest-rank P90 and its lower confidence bound, in ms (0, 0: no samples)."""
        horizon = self._clock() - self.window_s
        while samples and samples[0][0] < horizon:
            samples.popleft()
        if not samples:
            return 0.0, 0.0
        ordered = sorted(value for _, value in samples)
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        return p90 * 1000, confident_p90(ordered) * 1000  # sorting a sorted list again is linear
