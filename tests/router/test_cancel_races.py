"""A cancel that lands in the same loop turn as the event being waited for must not be lost.

On Python 3.11, `asyncio.wait_for` returns the inner result in that case and swallows the
cancel: the worker then streamed a request to its end for a client that had gone (seen as a
flaky "worker request aborted after cancel" in CI), and a batch request whose caller had left
would go on to a worker. Each wait below is one the fleet cancels in normal operation.
"""

from __future__ import annotations

import asyncio

import pytest

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig

from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig
from vllm_fleet.worker.in_flight import next_event


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
    waiting = asyncio.create_task(next_event(events, loop.time() + 30, loop))  # a coalescing deadline
    await _cancel_as_it_fires(waiting, lambda: events.put_nowait("chunk"))


async def test_a_batch_request_waiting_for_slack_keeps_a_cancel_that_lands_with_the_wake_up():
    gate = BatchGate(ServiceClassConfig())
    waiting = asyncio.create_task(gate.wait(30))
    await _cancel_as_it_fires(waiting, gate.notify)


async def test_a_client_that_left_and_a_router_that_closed_leave_nothing_running_on_the_worker(mock_worker_factory):
    """The client goes away after the first chunk and the router closes right after: the worker's
    stream gets the client's cancel and then its call's end. It once stayed in flight in about 40%
    of runs (the second cancellation cut the worker's close short), and a test's teardown then
    waited 10 s for the drain; a few rounds make that a near certainty."""
    worker = await mock_worker_factory.start(mock_tokens_per_s=100, mock_ttft_ms=5)
    probe = WorkerClient(worker.address)

    async def nothing_in_flight() -> bool:
        return (await probe.load()).in_flight == 0

    try:
        for round_ in range(6):
            router = Router(StaticRegistry.from_spec([worker.address]), RouterConfig())
            await router.start()
            try:
                await router.wait_ready(timeout=30)
                request = build_request(f"left-{round_}", [GenerateInput(text="short prompt")],
                                        SamplingParams(max_tokens=900), stream_interval_ms=50)
                stream = router.stream(request)
                async for _ in stream:
                    break
                await stream.aclose()
            finally:
                await router.close()
            await wait_until(nothing_in_flight, timeout=5, message=f"round {round_}: the worker's in_flight back to 0")
    finally:
        await probe.close()
