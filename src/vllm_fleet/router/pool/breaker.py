"""A per-worker circuit breaker: stop sending to a worker that keeps failing, then probe it.

    closed ──(failure_threshold consecutive failures)──▶ open
    open ──(open_s passed)──▶ half_open: one probe request at a time
    half_open ──(success_threshold probe successes)──▶ closed
    half_open ──(a probe fails)──▶ open again

A breaker opens only while the pool has room to take its worker out (`may_open`): with the
workers outlier ejection took out, open breakers never exceed the pool's maximum share
(`ejection_max_ratio`), so failures everywhere cannot empty the pool (Envoy's max ejection percent).

The clock is injectable so tests step time instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vllm_fleet.router.pool.snapshot import CLOSED, HALF_OPEN, OPEN


class CircuitBreaker:
    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        open_s: float = 5.0,
        success_threshold: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.success_threshold = success_threshold
        self._clock = clock
        self._state = CLOSED
        self._failures = 0           # consecutive, while closed
        self._successes = 0          # probe successes, while half-open
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> str:
        if self._state == OPEN and self._clock() - self._opened_at >= self.open_s:
            self._state = HALF_OPEN
            self._successes = 0
            self._probe_in_flight = False
        return self._state

    def retry_after(self) -> float:
        """Seconds until an open breaker lets a probe through (0 if it is not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.open_s - self._clock())

    def allow(self) -> bool:
        """Whether a request may go to this worker now. In half-open state this takes the one
        probe slot; the caller must then report the outcome (success, failure or release)."""
        state = self.state
        if state == CLOSED:
            return True
        if state == HALF_OPEN and not self._probe_in_flight:
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        state = self.state
        if state == CLOSED:
            self._failures = 0
        elif state == HALF_OPEN:
            self._probe_in_flight = False
            self._successes += 1
            if self._successes >= self.success_threshold:
                self._state = CLOSED
                self._failures = 0

    def record_failure(self, may_open: bool = True) -> None:
        """A request failed here. `may_open`: the pool has room to take this worker out (it never
        takes out more than its maximum share, pool/membership.py); without room the breaker stays as it is
        and counts on, and opens at the first failure once there is room. A failed probe without
        room frees its slot for the next probe."""
        state = self.state
        if state == CLOSED:
            self._failures += 1
            if self._failures >= self.failure_threshold and may_open:
                self._open()
        elif state == HALF_OPEN:
            if may_open:
                self._open()
            else:
                self._probe_in_flight = False

    def release(self) -> None:
        """The request ended with no verdict on the worker (e.g. the client went away)."""
        if self._state == HALF_OPEN:
            self._probe_in_flight = False

    def _open(self) -> None:
        self._state = OPEN
        self._opened_at = self._clock()
        self._failures = 0
        self._probe_in_flight = False
