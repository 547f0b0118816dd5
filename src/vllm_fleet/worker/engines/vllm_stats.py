"""The engine's numbers for `Load`, from vLLM's own scheduler statistics.

vLLM reports them to its stat loggers after each step; ours keeps the latest in this process,
so a Load is answered without a round trip to the engine core.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from vllm_fleet.protocol.types import WorkerLoad


class LoadRecorder:
    """The latest scheduler numbers for `Load`, fed by vLLM's stat logger (below)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._generated: deque[tuple[float, int]] = deque()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs + getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_queries += prefix.queries
                self.prefix_hits += prefix.hits
        if iteration_stats is not None and iteration_stats.num_generation_tokens:
            self._generated.append((time.monotonic(), iteration_stats.num_generation_tokens))

    def tokens_per_s(self, window_s: float = 5.0) -> float:
        cutoff = time.monotonic() - window_s
        while self._generated and self._generated[0][0] < cutoff:
            self._generated.popleft()
        return sum(n for _, n in self._generated) / window_s

    def load(self) -> WorkerLoad:
        """The latest numbers as a Load (the worker adds its own: in flight, draining, ...)."""
        hit_rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
        return WorkerLoad(running=self.running, waiting=self.waiting, kv_cache_usage=self.kv_cache_usage,
                          prefix_cache_hit_rate=hit_rate, output_tokens_per_s=self.tokens_per_s(),
                          prefix_cache_queries=self.prefix_queries, prefix_cache_hits=self.prefix_hits)


def stat_logger_factory(recorder: LoadRecorder):
    """A stat logger class for AsyncLLM (it takes classes, and makes one per engine core) that
    hands every report to `recorder`. Built in a function: vLLM is imported only once used."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class FleetLoadLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            recorder.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return FleetLoadLogger
