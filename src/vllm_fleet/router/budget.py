"""The retry budget: retries may add at most `ratio` of recent requests, plus a small floor.

Without it, a pool in trouble gets each request two or three times (every failure retried),
which turns a slowdown into an outage. Failovers and migrations both spend from it, and the
budget shrinks as the pool saturates (the caller passes the share open, `headroom`), as Envoy's
retry budget is a share of what the cluster can take.
Counts live in one-second slots over a sliding window, so old traffic ages out.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


class RetryBudget:
    def __init__(
        self,
        *,
        ratio: float = 0.2,
        min_per_s: float = 10.0,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._clock = clock
        self._slots: deque[list[int]] = deque()  # [second, requests, retries], oldest first

    def _slot(self) -> list[int]:
        now = math.floor(self._clock())
        while self._slots and self._slots[0][0] <= now - self.window_s:
            self._slots.popleft()
        if not self._slots or self._slots[-1][0] != now:
            self._slots.append([now, 0, 0])
        return self._slots[-1]

    def record_request(self) -> None:
        self._slot()[1] += 1

    def available(self, headroom: float = 1.0) -> float:
        """Retries still allowed in the current window, with `headroom` (0..1) of the budget open."""
        self._slot()
        requests = sum(s[1] for s in self._slots)
        retries = sum(s[2] for s in self._slots)
        return headroom * (self.ratio * requests + self.min_per_s * self.window_s) - retries

    def try_spend(self, headroom: float = 1.0) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is exhausted.
        `headroom`: the share of the budget open now, which shrinks as the pool saturates
        (Pool.retry_headroom): retries into full queues only lengthen them."""
        if self.available(headroom) < 1:
            return False
        self._slot()[2] += 1
        return True
