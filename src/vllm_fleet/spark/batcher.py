"""The micro-batching window: rows gather into a batch that is sent when it is full
(`batch_size`) or when its first row has waited `batch_wait_s`, whichever comes first, while
at most `max_in_flight` rows are out at once (submit() waits for a slot: back-pressure on the
Spark iterator rather than an unbounded queue). A batch also closes when the in-flight bound is
reached: no row can join it until another finishes, so waiting would only idle the workers.

A batch is handed to `send(rows)`, which must resolve every row's future (it is the Answerer
per row or per batch); the slot of a row is freed when its future is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.spark.rows import RowResult


@dataclass(slots=True)
class PendingRow:
    item: GenerateInput
    request_id: str
    future: asyncio.Future[RowResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class MicroBatcher:
    def __init__(self, send: Callable[[list[PendingRow]], Awaitable[Any]], *, batch_size: int, batch_wait_s: float,
                 max_in_flight: int) -> None:
        self._send = send
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._batch: list[PendingRow] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.batches_sent = 0

    async def submit(self, item: GenerateInput, request_id: str) -> asyncio.Future[RowResult]:
        """Queue one row; returns its future. Waits while `max_in_flight` rows are out."""
        await self._slots.acquire()
        row = PendingRow(item, request_id)
        row.future.add_done_callback(lambda _: self._slots.release())
        self._batch.append(row)
        if len(self._batch) >= self.batch_size or self._slots.locked():
            # At the in-flight bound no other row can join before one finishes: holding this
            # batch for the window would only idle the workers.
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.batch_wait_s, self.flush)
        return row.future

    def flush(self) -> None:
        """Send what has gathered now (the window's timer, a full batch, or the end of input)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        self.batches_sent += 1
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[PendingRow]) -> None:
        try:
            await self._send(batch)
        except Exception as exc:  # a bug in send must not lose rows: each gets the error
            for row in batch:
                if not row.future.done():
                    row.future.set_result(RowResult.failed(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            for row in batch:
                if not row.future.done():
                    row.future.set_result(RowResult.failed("internal error: the batch ended without an answer"))

    async def close(self) -> None:
        """Cancel what is still being sent (the Spark task stopped early)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
