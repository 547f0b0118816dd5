"""One attempt's claim on a worker (Lease), from `Pool.try_acquire` while the attempt runs.

The lease counts the attempt in flight with the tokens it still owes, and credits a half-open
breaker's probe at its first output.
"""

from __future__ import annotations

from vllm_fleet.router.pool.worker import WorkerState


class Lease:
    """One attempt's claim on a worker: counts it in flight with its outstanding tokens."""

    __slots__ = ("_worker", "remaining", "probe", "credited")

    def __init__(self, worker: WorkerState, tokens: int, probe: bool = False) -> None:
        self._worker = worker
        self.remaining = tokens
        self.probe = probe          # holds a half-open breaker's one probe slot
        self.credited = False       # ... and its first output already counted as the probe's success
        worker.in_flight += 1
        worker.outstanding_tokens += tokens

    def progress(self, tokens: int) -> None:
        """A chunk came: `tokens` of the claim are done."""
        if self._worker is None:
            return
        if self.probe and not self.credited:
            # A probe proves the worker serves at its first output, not at its end: a stream
            # holding the one probe slot for its whole answer would keep a recovered worker to
            # one request at a time for minutes.
            self.credited = True
            self._worker.breaker.record_success()
        done = min(tokens, self.remaining)
        self.remaining -= done
        self._worker.outstanding_tokens -= done

    def release(self) -> None:
        if self._worker is None:
            return
        self._worker.in_flight -= 1
        self._worker.outstanding_tokens -= self.remaining
        self.remaining = 0
        self._worker = None
