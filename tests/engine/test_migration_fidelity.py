"""What a migration keeps, on the real engine (docs/migration.md, #28).

A migrated answer continues on the next worker from the prompt plus the tokens already sent,
which that worker's engine reads as prompt. The requests here are the ones the router sends
after a switch (`resume_token_ids`), sent straight to one real worker, each alone.

- Kept exactly: greedy decoding, and repetition_penalty (vLLM applies it to prompt and output
  tokens alike, so the resumed tokens still count). The greedy side is also checked character by
  character, cut inside and between characters, in
  test_vllm_worker.py::test_a_stream_resumed_inside_a_character_loses_and_repeats_nothing.
- Valid but different after the switch: a seeded sample (vLLM's per-request generator starts
  again from the seed) and presence/frequency penalties (vLLM counts output tokens only, and the
  resumed tokens are now prompt). Nothing is lost or repeated; the rest is a different answer.
"""

from __future__ import annotations

import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import ChatMessage, GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request

pytestmark = pytest.mark.engine

TOKENS = 32
CUT = 8   # tokens sent before the switch


def _question(text: str, resume: list[int] | None = None) -> GenerateInput:
    return GenerateInput(messages=[ChatMessage("user", text)], resume_token_ids=list(resume or []))


async def _ids(client: WorkerClient, rid: str, item: GenerateInput, params: SamplingParams) -> list[int]:
    ids, finish = [], None
    async for chunk in client.generate(build_request(rid, [item], params), timeout=120):
        ids += chunk.token_ids
        finish = chunk.finish_reason or finish
    assert finish == "length", f"{rid}: the answer ended early ({finish})"
    return ids


async def _whole_and_migrated(client, name: str, question: str, params: SamplingParams) -> tuple[list[int], list[int]]:
    """The answer's token ids alone, and the ids of the same answer cut after CUT tokens and resumed."""
    whole = await _ids(client, f"{name}-whole", _question(question), params)
    assert len(whole) == TOKENS
    rest = await _ids(client, f"{name}-resumed", _question(question, whole[:CUT]), params)
    assert len(rest) == TOKENS - CUT, "a resumed answer must produce exactly the tokens left"
    return whole, whole[:CUT] + rest


@pytest.fixture(scope="module")
async def client(vllm_worker):
    async with WorkerClient(vllm_worker.address) as worker_client:
        yield worker_client


async def test_greedy_with_repetition_penalty_continues_exactly(client):
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.3)
    whole, migrated = await _whole_and_migrated(client, "repetition", "List five fruits, one per line.", params)
    assert migrated == whole


async def test_a_seeded_sample_stays_valid_but_its_random_stream_restarts_at_the_switch(client):
    params = SamplingParams(temperature=1.5, seed=1234, max_tokens=TOKENS, ignore_eos=True)
    question = "Write a short story about a dragon."
    whole, migrated = await _whole_and_migrated(client, "seeded", question, params)
    # The seed still means something: the same request alone gives the same answer again.
    assert await _ids(client, "seeded-again", _question(question), params) == whole
    assert migrated[CUT:] != whole[CUT:], "the seeded stream was carried across the switch: update docs/migration.md"


async def test_frequency_and_presence_penalties_forget_the_tokens_before_the_switch(client):
    # Penalties strong enough that the whole answer avoids its own earlier tokens: after the
    # switch those are prompt, unpenalised, and the greedy continuation changes.
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True,
                            frequency_penalty=2.0, presence_penalty=2.0)
    question = "Repeat the word 'hello' twenty times."
    whole, migrated = await _whole_and_migrated(client, "penalties", question, params)
    assert migrated[CUT:] != whole[CUT:], "penalties were carried across the switch: update docs/migration.md"
    plain = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    assert await _ids(client, "unpenalised", _question(question), plain) != whole, "the penalties had no effect"
