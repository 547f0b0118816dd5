"""One Spark partition's rows, answered inside the executor's event loop.

`PartitionRun.answer_rows` takes plain row values (already read out of Arrow) and returns one
RowResult per row, in order. Independent rows go through the MicroBatcher; sessions go turn
by turn, each turn carrying the conversation so far (see `sessions.py`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.batcher import MicroBatcher, PendingRow
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.ledger import TaskLedger
from vllm_fleet.spark.progress import ProgressReporter
from vllm_fleet.spark.rows import RowResult, batch_request_id, request_id_for, to_input


class PartitionRun:
    """Answers the rows of one partition; `task_key` makes request ids unique per task."""

    def __init__(self, answerer: Answerer, config: SparkGenerateConfig, task_key: str,
                 ledger: TaskLedger | None = None, progress: ProgressReporter | None = None) -> None:
        self.answerer = answerer
        self.ledger = ledger
        self.progress = progress
        self.config = config
        self.task_key = task_key
        self.batcher = MicroBatcher(
            self._send, batch_size=config.batch_size, batch_wait_s=config.batch_wait_ms / 1000,
            max_in_flight=config.max_in_flight,
        )
        self._position = 0

    async def answer_rows(self, values: list[Any], keys: list[Any] | None) -> list[RowResult]:
        """Results for `values` (prompts or messages), in order. `keys` are id_col values, if any."""
        futures: list[asyncio.Future[RowResult]] = []
        for offset, value in enumerate(values):
            row_key = str(keys[offset]) if keys is not None else f"{self.task_key}:{self._position + offset}"
            try:
                item = to_input(value, chat=self.config.messages_col is not None)
            except ValueError as exc:
                futures.append(self._counted(_done(RowResult.failed(f"bad row: {exc}"))))
                continue
            request_id = request_id_for(item, self.config.params, self.config.model, row_key)
            if self.ledger is not None and (answered := self.ledger.lookup(request_id)) is not None:
                futures.append(self._counted(_done(answered)))  # generated before a crash or retry: not resent
                continue
            future = await self.batcher.submit(item, request_id)
            if self.ledger is not None:
                future.add_done_callback(functools.partial(_record, self.ledger, request_id))
            futures.append(self._counted(future))
        self._position += len(values)
        self.batcher.flush()  # the end of this Arrow batch: no point waiting for more rows
        return list(await asyncio.gather(*futures))

    def _counted(self, future: asyncio.Future[RowResult]) -> asyncio.Future[RowResult]:
        """`future`, counted by the progress reporter when it finishes. Attached as each row is
        queued: submit() waits for a slot, so attaching after the loop would count a whole Arrow
        batch only at its end."""
        if self.progress is not None:
            future.add_done_callback(functools.partial(_count, self.progress))
        return future

    async def _send(self, batch: list[PendingRow]) -> None:
        if self.config.send_as == "one_request" and len(batch) > 1:
            ids = [row.request_id for row in batch]
            results = await self.answerer.answer_batch([row.item for row in batch], batch_request_id(ids), ids)
            for row, result in zip(batch, results):
                row.future.set_result(result)
            return
        await asyncio.gather(*(self._send_one(row) for row in batch))

    async def _send_one(self, row: PendingRow) -> None:
        row.future.set_result(await self.answerer.answer(row.item, row.request_id))

    async def close(self) -> None:
        await self.batcher.close()


def _record(ledger: TaskLedger, request_id: str, future: asyncio.Future[RowResult]) -> None:
    """Into the ledger as soon as the row finishes, not at the end of the task: a crash then
    loses only the rows still in flight."""
    if not future.cancelled():
        ledger.record(request_id, future.result())


def _count(progress: ProgressReporter, future: asyncio.Future[RowResult]) -> None:
    if not future.cancelled():
        result = future.result()
        progress.row_done(error=result.error is not None, tokens=result.completion_tokens or 0)


def _done(result: RowResult) -> asyncio.Future[RowResult]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future
