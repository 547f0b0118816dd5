"""How batches advance: Prometheus series in the gateway's registry, and a progress log line.

The batch object keeps OpenAI's shape (request_counts only); rates and an ETA go to the log
(every PROGRESS_EVERY_S per running batch) and the series below.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter("vllm_fleet_gateway_batch_lines", "Batch lines finished by this process, by outcome "
                             "(done, failed)", ["outcome"], registry=registry)
        self.tokens = Counter("vllm_fleet_gateway_batch_tokens", "Tokens of batch lines, in (prompt) and out "
                              "(completion)", ["direction"], registry=registry)
        self.in_flight = Gauge("vllm_fleet_gateway_batch_lines_in_flight", "Batch lines running now",
                               registry=registry)
        self.running = Gauge("vllm_fleet_gateway_batches_running", "Batches this process runs now (holds the lease "
                             "of)", registry=registry)
        self.done = self.lines.labels("done")
        self.failed = self.lines.labels("failed")
        self.prompt = self.tokens.labels("prompt")
        self.completion = self.tokens.labels("completion")


class Progress:
    """One running batch's rates since this runner took it, logged now and then."""

    def __init__(self, batch_id: str, total: int, finished: int) -> None:
        self.batch_id = batch_id
        self.total = total
        self.finished = finished
        self.started = self._last_log = time.monotonic()
        self.lines = 0
        self.tokens = 0

    def add(self, completion_tokens: int) -> None:
        self.finished += 1
        self.lines += 1
        self.tokens += completion_tokens
        now = time.monotonic()
        if now - self._last_log >= PROGRESS_EVERY_S:
            self._last_log = now
            self.log(now)

    def log(self, now: float | None = None) -> None:
        elapsed = max(1e-9, (now or time.monotonic()) - self.started)
        rate = self.lines / elapsed
        left = self.total - self.finished
        eta = f"{left / rate:.0f}s" if rate > 0 else "unknown"
        logger.info("batch %s: %d/%d lines, %.1f lines/s, %.0f tokens/s, ETA %s", self.batch_id, self.finished,
                    self.total, rate, self.tokens / elapsed, eta, extra={"request_id": self.batch_id})
