"""The retry budget: retries may add at most `ratio` of recent requests, plus a small floor.

Without it, a pool in trouble gets each request two or three times (every failure retried),
which turns a slowdown into an outage. Failovers and migrations both spend from it.
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

    def available(self) -> float:
        """Retries still allowed in the current window."""
        self._slot()
        requests = sum(s[1] for s in self._slots)
        retries = sum(s[2] for s in self._slots)
        return self.ratio * requests + self.min_per_s * self.window_s - retries

    def try_spend(self) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is exhausted."""
        if self.available() < 1:
            return False
        self._slot()[2] += 1
        return True
