"""The vLLM engine hands the request's cache_salt to vLLM with the prompt (vLLM keys the prompt's
prefix-cache blocks by it). No engine is started: vLLM's AsyncLLM is replaced by a recorder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.worker.engines.vllm_engine import VllmEngine

pytest.importorskip("vllm")


class RecordingLLM:
    def __init__(self) -> None:
        self.prompts: list[dict] = []

    async def generate(self, prompt, params, request_id, **kwargs):
        self.prompts.append(dict(prompt))
        return
        yield  # an async generator that produces nothing


@pytest.mark.parametrize("salt", ["tenant-a", None])
async def test_the_prompt_carries_the_cache_salt_when_the_request_has_one(salt):
    engine = VllmEngine(EngineConfig())
    engine._llm = RecordingLLM()
    engine.schedules_by_priority = False
    extra = {"cache_salt": salt} if salt is not None else {}
    assert [d async for d in engine.generate("r", [1, 2, 3], SimpleNamespace(logprobs=None), **extra)] == []
    (prompt,) = engine._llm.prompts
    assert prompt["prompt_token_ids"] == [1, 2, 3]
    assert prompt.get("cache_salt") == salt
