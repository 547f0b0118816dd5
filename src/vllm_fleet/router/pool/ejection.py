"""Outlier ejection: take out a worker that fails a large share of its recent requests.

The breaker only sees *consecutive* failures, so a worker that fails every other request
(a bad GPU, a flapping link) never trips it. Ejection looks at the failure ratio over a
window instead, never ejects more than `max_ratio` of the workers of a model, counting those
whose breaker is open (so a fault everywhere does not empty the pool; a model with one worker
never loses it), and ejects repeat offenders for longer each time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class OutlierDetector:
    def __init__(
        self,
        *,
        failure_ratio: float = 0.5,
        min_requests: int = 10,
        window_s: float = 30.0,
        base_ejection_s: float = 10.0,
        max_ratio: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_ratio = failure_ratio
        self.min_requests = min_requests
        self.window_s = window_s
        self.base_ejection_s = base_ejection_s
        self.max_ratio = max_ratio
        self._clock = clock
        self._outcomes: dict[str, deque[tuple[float, bool]]] = {}
        self._ejected_until: dict[str, float] = {}
        self._times_ejected: dict[str, int] = {}

    def record(self, address: str, ok: bool, group: list[str], *, out: Callable[[str], bool] = lambda _: False) -> bool:
        """Record one outcome; eject `address` if it is now an outlier among `group` (the
        workers of its model). `out(address)`: that worker is out of rotation for another reason
        (its breaker is open), which counts against the same maximum share. Returns True when
        this call ejected it."""
        now = self._clock()
        outcomes = self._outcomes.setdefault(address, deque())
        outcomes.append((now, ok))
        while outcomes and outcomes[0][0] < now - self.window_s:
            outcomes.popleft()
        if ok or len(outcomes) < self.min_requests or self.is_ejected(address):
            return False
        failures = sum(1 for _, good in outcomes if not good)
        if failures / len(outcomes) < self.failure_ratio:
            return False
        ejected_now = sum(1 for a in group if a != address and (self.is_ejected(a) or out(a)))
        if ejected_now + 1 > self.max_ratio * len(group):
            return False
        times = self._times_ejected.get(address, 0) + 1
        self._times_ejected[address] = times
        self._ejected_until[address] = now + self.base_ejection_s * 2 ** min(times - 1, 5)
        outcomes.clear()  # judged afresh when it comes back
        return True

    def is_ejected(self, address: str) -> bool:
        return self._ejected_until.get(address, 0.0) > self._clock()

    def forget(self, address: str) -> None:
        self._outcomes.pop(address, None)
        self._ejected_until.pop(address, None)
        self._times_ejected.pop(address, None)
