"""A cancel that lands in the same loop turn as the event being waited for must not be lost.

On Python 3.11, `asyncio.wait_for` returns the inner result in that case and swallows the
cancel: the worker then streamed a request to its end for a client that had gone (seen as a
flaky "worker request aborted after cancel" in CI), and a batch request whose caller had left
would go on to a worker. Each wait below is one the fleet cancels in normal operation.
"""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig
from vllm_fleet.worker.generate_rpcs import _next_event


async def _cancel_as_it_fires(waiting: asyncio.Task, fire) -> None:
    await asyncio.sleep(0)  # one loop turn: the task is now blocked in its wait
    assert not waiting.done()
    fire()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_the_worker_stream_loop_keeps_a_cancel_that_lands_with_an_event():
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    waiting = asyncio.create_task(_next_event(events, loop.time() + 30, loop))  # a coalescing deadline
    await _cancel_as_it_fires(waiting, lambda: events.put_nowait("chunk"))


async def test_a_batch_request_waiting_for_slack_keeps_a_cancel_that_lands_with_the_wake_up():
    gate = BatchGate(ServiceClassConfig())
    waiting = asyncio.create_task(gate.wait(30))
    await _cancel_as_it_fires(waiting, gate.notify)
