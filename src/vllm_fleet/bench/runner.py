"""The load generator: open loop (planned arrivals) or closed loop (fixed users), one run per load.

Every run of a sweep replays the same workload items and the same arrival schedule (same
seed), so rates differ only in pace. The first `warmup_requests` of each run are sent the
same way and marked, then left out of the figures. A run stops by itself: after
`num_requests` measured requests or `duration` seconds of arrivals, whichever comes first;
answers still missing `drain_timeout` seconds after the last arrival are cancelled and
counted as 'unfinished', so an overloaded system cannot stall the bench.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from vllm_fleet.bench.arrivals import ArrivalProcess
from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.metrics import Slo, summarize
from vllm_fleet.bench.progress import Progress
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.targets import Clock, Target, TargetError
from vllm_fleet.bench.workloads import BenchItem, Workload
from vllm_fleet.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class LoadRun:
    """One load level of a benchmark and what it measured."""

    mode: str                      # "rate" (open loop) or "concurrency" (closed loop)
    value: float
    burstiness: float
    started_at: str
    records: list[RequestRecord] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    # 1-minute load average of the machine before and after the run: on a shared machine,
    # a reader must be able to see that other work competed with the system under test.
    load_average: tuple[float, float] = (0.0, 0.0)

    @property
    def load_label(self) -> str:
        if self.mode == "concurrency":
            return f"concurrency {self.value:g}"
        return "rate inf" if math.isinf(self.value) else f"rate {self.value:g}/s"


class Runner:
    def __init__(self, target: Target, workload: Workload, config: BenchConfig) -> None:
        self.target = target
        self.workload = workload
        self.config = config
        self.slo = Slo.parse(config.slo)
        loads = config.loads()
        if config.duration is not None and config.num_requests is None:
            if any(mode == "rate" and math.isinf(value) for mode, value in loads):
                raise ConfigError("--rate inf sends everything at once; bound it with --num-requests, not --duration")
        self.loads = loads
        # Request ids stay unique across bench invocations against the same long-lived server.
        self.run_id = secrets.token_hex(3)

    async def run(self) -> list[LoadRun]:
        """Every load in turn, against one started target."""
        await self.target.start()
        try:
            return [await self.run_load(mode, value) for mode, value in self.loads]
        finally:
            await self.target.close()

    async def run_load(self, mode: str, value: float) -> LoadRun:
        run = LoadRun(mode, value, self.config.burstiness, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        progress = Progress(f"{self.config.display_name} {run.load_label}", total=self.config.measured_requests(),
                            duration=self.config.duration, enabled=self.config.progress)
        items = self.workload.items()
        load_before = os.getloadavg()[0]
        tag = f"{self.run_id}-{mode[0]}{value:g}"
        try:
            if mode == "rate":
                run.records = await self._open_loop(value, items, progress, tag)
            else:
                run.records = await self._closed_loop(int(value), items, progress, tag)
        finally:
            progress.close()
        run.load_average = (load_before, os.getloadavg()[0])
        run.summary = summarize(run.records, self.slo)
        logger.info("%s: %d requests, %.2f req/s, %.1f output tok/s, errors %s", run.load_label,
                    run.summary["requests"]["sent"], run.summary["request_throughput"],
                    run.summary["output_throughput"], run.summary["errors"] or "none")
        short = run.summary["requests"]["short_answers"]
        if short:
            logger.warning("%s: %d answers had fewer tokens than max_tokens although ignore_eos was set "
                           "(does the target honour ignore_eos?); they are not counted as completed",
                           run.load_label, short)
        return run

    def _stop(self, index: int, elapsed_measured: float | None) -> bool:
        """Whether request `index` (0-based, warm-up included) is past the end of the run."""
        measured = index - self.config.warmup_requests
        if measured < 0:
            return False
        limit = self.config.measured_requests()
        if limit is not None and measured >= limit:
            return True
        return self.config.duration is not None and elapsed_measured is not None and elapsed_measured >= self.config.duration

    async def _open_loop(self, rate: float, items: Iterator[BenchItem], progress: Progress, tag: str) -> list[RequestRecord]:
        clock = Clock()
        arrivals = ArrivalProcess(rate, burstiness=self.config.burstiness, seed=self.config.seed).iter_times()
        records: list[RequestRecord] = []
        tasks: list[asyncio.Task] = []
        measured_from: float | None = None
        for index, planned in enumerate(arrivals):
            if index == self.config.warmup_requests:
                measured_from = planned
            if self._stop(index, None if measured_from is None else planned - measured_from):
                break
            delay = planned - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            item = next(items)
            record = self._record(index, item, planned, tag)
            records.append(record)
            tasks.append(asyncio.create_task(self._send(record, item, clock, progress)))
        await self._drain(tasks)
        return records

    async def _closed_loop(self, users: int, items: Iterator[BenchItem], progress: Progress, tag: str) -> list[RequestRecord]:
        clock = Clock()
        records: list[RequestRecord] = []
        counter = itertools.count()
        measured_from: list[float] = []

        async def user() -> None:
            while True:
                index = next(counter)
                if index == self.config.warmup_requests:
                    measured_from.append(clock())
                if self._stop(index, clock() - measured_from[0] if measured_from else None):
                    return
                item = next(items)
                record = self._record(index, item, clock(), tag)
                records.append(record)
                await self._send(record, item, clock, progress)

        tasks = [asyncio.create_task(user()) for _ in range(users)]
        await self._drain(tasks, first_wait=self.config.duration)
        return records

    def _record(self, index: int, item: BenchItem, planned: float, tag: str) -> RequestRecord:
        return RequestRecord(request_id=f"bench-{tag}-{index}", kind=item.kind, session_id=item.session_id,
                             scheduled=planned, expected_output_tokens=item.max_tokens,
                             ignore_eos=self.config.ignore_eos,
                             warmup=index < self.config.warmup_requests)

    async def _send(self, record: RequestRecord, item: BenchItem, clock: Clock, progress: Progress) -> None:
        record.start = clock()
        try:
            await asyncio.wait_for(self.target.send(item, record, clock), self.config.request_timeout)
        except asyncio.CancelledError:
            record.error, record.error_message = "unfinished", "cancelled: still running at the end of the drain timeout"
            raise
        except TimeoutError:
            record.error, record.error_message = "timeout", f"no complete answer within {self.config.request_timeout:g}s"
        except TargetError as exc:
            record.error, record.error_message = exc.kind, str(exc)
        except Exception as exc:  # every failure is a data point, whatever raised it
            record.error, record.error_message = type(exc).__name__, str(exc)[:300]
        finally:
            record.end = clock()
            if record.error and not record.warmup:
                logger.debug("request failed: %s: %s", record.error, record.error_message,
                             extra={"request_id": record.request_id})
            if not record.warmup:
                progress.update(failed=not record.ok)

    async def _drain(self, tasks: list[asyncio.Task], first_wait: float | None = 0.0) -> None:
        """Wait for `tasks`, at most `first_wait` (None: without bound) + drain_timeout seconds."""
        if not tasks:
            return
        timeout = None if first_wait is None else first_wait + self.config.drain_timeout
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning("%d requests unfinished after the drain timeout; cancelled", len(pending))
            await asyncio.gather(*pending, return_exceptions=True)
