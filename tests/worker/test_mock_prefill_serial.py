"""The mock engine's serial prefill (`mock_prefill_serial`): prompts prefill one at a time, as one
engine's prefills share its compute, so routing benchmarks on mock engines see a long prefill
delay the prompts behind it (the effect cache-aware routing's load guard reacts to)."""

from __future__ import annotations

import asyncio

from vllm_fleet.config import EngineConfig
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.worker import prepare
from vllm_fleet.worker.engines.mock_engine import MockEngine

PREFILL_S = 0.4  # each prompt's: 400 tokens at 1 s per 1,000


async def first_token_at(engine: MockEngine, rid: str, prompt: list[int]) -> float:
    request = build_request(rid, [GenerateInput(token_ids=prompt)], SamplingParams(max_tokens=2))
    item = await prepare.prepare_input(engine, 0, request, max_logprobs=5)
    loop = asyncio.get_running_loop()
    async for deltas in engine.generate(rid, item.prompt_token_ids, item.engine_params):
        if deltas[0].token_ids:
            return loop.time()
    raise AssertionError("no token")


async def test_a_prompt_behind_another_waits_for_its_prefill():
    engine = MockEngine(EngineConfig(engine="mock", mock_prefill_serial=True, mock_ttft_ms=0,
                                     mock_prefill_ms_per_1k=PREFILL_S * 1000 * 1000 / 400, mock_tokens_per_s=1000))
    await engine.start()
    prompts = [[5 + (i + j) % 30 for j in range(400)] for i in range(2)]
    first, second = sorted(await asyncio.gather(*(first_token_at(engine, f"r{i}", p) for i, p in enumerate(prompts))))
    # The second prompt's prefill starts only when the first's ends (a lower bound: load only delays it).
    assert second - first >= PREFILL_S * 0.9
