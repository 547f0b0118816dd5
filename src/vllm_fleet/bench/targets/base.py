"""What every target does: send one item and fill in its record as the answer streams back."""

from __future__ import annotations

import abc
import time

from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.workloads import BenchItem


class Clock:
    """The runner's clock: seconds since the run started, monotonic."""

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self._origin


class TargetError(Exception):
    """A request failed in a way the target can name (`kind`, e.g. 'http_429', 'stream_error')."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Target(abc.ABC):
    """A system under test. `send` streams one request, appending to `record.chunk_times` /
    `chunk_tokens` as output arrives and setting the token counts; it raises on failure
    (the runner records the error and the end time)."""

    name = "target"

    async def start(self) -> None:
        """Connect, discover what is needed (e.g. the model name)."""

    @abc.abstractmethod
    async def send(self, item: BenchItem, record: RequestRecord, clock: Clock) -> None: ...

    async def close(self) -> None:
        """Release connections."""

    def describe(self) -> str:
        return self.name
