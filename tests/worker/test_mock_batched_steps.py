"""The mock engine's batched steps (`mock_batched_steps`): every running sequence steps on one
shared clock, as a GPU engine's batch does; the tokens are the same as with a timer per sequence,
and a sequence that leaves (cancelled) does not stop the others."""

from __future__ import annotations

import asyncio

from vllm_fleet.config import EngineConfig
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.worker import prepare
from vllm_fleet.worker.engines.mock_engine import MockEngine


async def _tokens(engine: MockEngine, rid: str, prompt: list[int], max_tokens: int,
                  started: asyncio.Event | None = None) -> list[int]:
    request = build_request(rid, [GenerateInput(token_ids=prompt)], SamplingParams(max_tokens=max_tokens))
    item = await prepare.prepare_input(engine, 0, request, max_logprobs=5)
    tokens = []
    async for deltas in engine.generate(rid, item.prompt_token_ids, item.engine_params):
        tokens.extend(deltas[0].token_ids)
        if started is not None:
            started.set()
    return tokens


async def test_batched_steps_give_every_sequence_its_own_tokens_and_survive_a_cancelled_one():
    own = MockEngine(EngineConfig(engine="mock", mock_ttft_ms=0, mock_tokens_per_s=1000))
    batched = MockEngine(EngineConfig(engine="mock", mock_ttft_ms=0, mock_tokens_per_s=1000, mock_batched_steps=True))
    for engine in (own, batched):
        await engine.start()
    prompts = [[5 + (i + j) % 30 for j in range(20)] for i in range(3)]
    expected = [await _tokens(own, f"o{i}", p, 40) for i, p in enumerate(prompts)]
    started = asyncio.Event()
    leaving = asyncio.ensure_future(_tokens(batched, "gone", prompts[0], 2_000, started))
    got = asyncio.gather(*(_tokens(batched, f"b{i}", p, 40) for i, p in enumerate(prompts)))
    await asyncio.wait_for(started.wait(), 30)  # it waits on the shared clock now
    leaving.cancel()
    assert await asyncio.wait_for(got, 30) == expected
