"""A request's priority (a batch-class request's later one: router/classes/service_class.py)
reaches vLLM's scheduler with the request where the engine schedules by priority (#52: nothing
asserted it). No engine is started: vLLM's AsyncLLM is replaced by a recorder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.worker.engines.vllm_engine import VllmEngine

pytest.importorskip("vllm")


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def generate(self, prompt, params, request_id, **kwargs):
        self.calls.append(kwargs)
        return
        yield  # an async generator that produces nothing


async def _generate(engine: VllmEngine, priority: int) -> dict:
    engine._llm = RecordingLLM()
    assert [d async for d in engine.generate("r", [1, 2, 3], SimpleNamespace(logprobs=None), priority=priority)] == []
    (kwargs,) = engine._llm.calls
    return kwargs


async def test_a_batch_priority_reaches_vllm_with_the_request():
    engine = VllmEngine(EngineConfig())
    engine.schedules_by_priority = True  # the worker's default (vllm_args: scheduling_policy=priority)
    assert (await _generate(engine, 10))["priority"] == 10
    assert (await _generate(engine, 0))["priority"] == 0


async def test_an_engine_that_serves_first_come_gets_no_priority():
    # vLLM refuses a priority under fcfs; the worker refuses such a request before (validation.py).
    engine = VllmEngine(EngineConfig())
    engine.schedules_by_priority = False
    assert "priority" not in await _generate(engine, 0)
