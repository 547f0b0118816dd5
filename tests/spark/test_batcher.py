"""The micro-batching window on its own: when a batch closes, and the in-flight bound."""

from __future__ import annotations

import asyncio

from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.spark.batcher import MicroBatcher, PendingRow
from vllm_fleet.spark.rows import RowResult


class Recorder:
    """A send() that answers each row with its text and remembers batch sizes and concurrency."""

    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.batches: list[list[str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold = hold

    async def __call__(self, batch: list[PendingRow]) -> None:
        self.batches.append([row.item.text for row in batch])
        self.in_flight += len(batch)
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(0)
        self.in_flight -= len(batch)
        for row in batch:
            row.future.set_result(RowResult(output=row.item.text))


async def test_a_full_batch_goes_at_once_without_waiting_for_the_window():
    send = Recorder()
    batcher = MicroBatcher(send, batch_size=3, batch_wait_s=3600, max_in_flight=10)
    futures = [await batcher.submit(GenerateInput(text=str(i)), f"r{i}") for i in range(3)]
    results = await asyncio.gather(*futures)  # would hang for an hour if the batch waited for the window
    assert [r.output for r in results] == ["0", "1", "2"]
    assert send.batches == [["0", "1", "2"]]


async def test_a_partial_batch_goes_when_the_window_passes():
    send = Recorder()
    batcher = MicroBatcher(send, batch_size=100, batch_wait_s=0.01, max_in_flight=100)
    future = await batcher.submit(GenerateInput(text="lonely"), "r0")
    assert (await future).output == "lonely"
    assert send.batches == [["lonely"]]


async def test_rows_in_flight_never_exceed_the_bound():
    send = Recorder()
    batcher = MicroBatcher(send, batch_size=4, batch_wait_s=0.001, max_in_flight=5)
    futures = [await batcher.submit(GenerateInput(text=str(i)), f"r{i}") for i in range(50)]
    batcher.flush()
    results = await asyncio.gather(*futures)
    assert [r.output for r in results] == [str(i) for i in range(50)]
    assert send.most_in_flight <= 5
    assert sum(len(b) for b in send.batches) == 50


async def test_at_the_bound_a_batch_goes_without_waiting_for_the_window():
    hold = asyncio.Event()
    send = Recorder(hold)
    batcher = MicroBatcher(send, batch_size=10, batch_wait_s=3600, max_in_flight=2)
    await batcher.submit(GenerateInput(text="a"), "ra")
    await batcher.submit(GenerateInput(text="b"), "rb")
    await asyncio.sleep(0)  # let the flushed batch's task start
    assert send.batches == [["a", "b"]], "no third row can join, so the batch is sent now"
    hold.set()


async def test_a_failing_send_still_answers_every_row():
    async def broken(batch: list[PendingRow]) -> None:
        raise RuntimeError("boom")

    batcher = MicroBatcher(broken, batch_size=2, batch_wait_s=0, max_in_flight=4)
    futures = [await batcher.submit(GenerateInput(text=str(i)), f"r{i}") for i in range(2)]
    results = await asyncio.gather(*futures)
    assert all("boom" in r.error for r in results)
