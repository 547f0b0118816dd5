"""Migration with stop strings on the real engine (#15): a greedy answer with a stop string,
its worker killed after the first chunks, resumed on another worker by the router.

vLLM holds back the last len(stop) - 1 characters while their token ids go out; the next
worker must send them, and the answer must end at the stop string exactly as a fault-free run
of the same prompt alone does.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from prometheus_client import CollectorRegistry

from support import WorkerProcess, vllm_worker_args, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

QUESTION = [GenerateInput(messages=[ChatMessage("user", "What is the capital of France?")])]
PARAMS = SamplingParams(temperature=0.0, max_tokens=32, stop=["Paris"])


@pytest.fixture
async def victim():
    """A real worker of our own on core 1 (the shared one is on core 0), to be killed."""
    args, env = vllm_worker_args("1")
    worker = WorkerProcess(args, env).start()
    try:
        await worker.wait_serving(600)
        yield worker
    finally:
        worker.kill()


async def _alone(address: str) -> tuple[str, object]:
    text, final = "", None
    async with WorkerClient(address) as client:
        async for chunk in client.generate(build_request("alone", QUESTION, PARAMS), timeout=120):
            text += chunk.text
            final = chunk if chunk.finish_reason else final
    return text, final


async def test_a_stream_with_a_stop_string_killed_after_its_first_chunks_ends_as_a_fault_free_one(
        vllm_worker, victim):
    want, want_final = await _alone(vllm_worker.address)
    assert (want_final.finish_reason, want_final.stop_reason) == ("stop", "Paris"), want

    # The stream starts on the victim alone; the survivor joins once it is under way.
    registry = StaticRegistry([WorkerRecord(address=victim.address)])
    config = RouterConfig(stall_timeout_s=300, first_chunk_timeout_s=300, load_poll_interval_s=0.2,
                          health_poll_interval_s=0.2)
    router = Router(registry, config, metrics_registry=CollectorRegistry())
    await router.start()
    got: dict = {"text": "", "ids": [], "final": None}
    try:
        await router.wait_ready(timeout=60)
        stream = router.stream(build_request("migrating", QUESTION, PARAMS))

        async def consume():
            async with stream:
                async for chunk in stream:
                    got["text"] += chunk.text
                    got["ids"] += chunk.token_ids
                    got["final"] = chunk if chunk.finish_reason else got["final"]

        task = asyncio.create_task(consume())
        await wait_until(lambda: got["ids"] or task.done(), timeout=120, message="the first chunk")
        victim.signal(signal.SIGSTOP)  # frozen mid-answer while the survivor joins
        assert not task.done(), "the answer finished before the fault"
        registry.set_workers([WorkerRecord(address=victim.address), WorkerRecord(address=vllm_worker.address)])
        await wait_until(lambda: any(w.address == vllm_worker.address for w in router.snapshot().eligible()),
                         timeout=30, message="the survivor in rotation")
        text_at_kill = got["text"]
        victim.kill()
        await asyncio.wait_for(task, 120)
    finally:
        await router.close()
    assert stream.migrations == 1, "the answer finished before the kill: nothing migrated"
    assert got["final"].finish_reason == "stop" and got["final"].stop_reason == "Paris"
    assert got["text"] == want, f"{text_at_kill!r} before the kill"
