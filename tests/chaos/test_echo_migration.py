"""An echo+logprobs completion whose worker is killed mid-answer (#27), on mock workers.

The prompt's logprobs come once, with the first worker's first chunk (vLLM computes them at
prefill). The stream then migrates: the next worker continues from prompt + tokens sent and asks
for no prompt logprobs, so the client sees the prompt's tokens exactly once, followed by the
answer with no token lost or repeated: the same answer as an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from support import wait_until

pytestmark = pytest.mark.timeout(120)

BODY = {"model": "chaos", "prompt": "echo across a kill", "max_tokens": 40, "ignore_eos": True, "echo": True,
        "logprobs": 1, "stream": True}


async def _stream(http: httpx.AsyncClient, body: dict, seen: list[dict]) -> None:
    async with http.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                seen.append(json.loads(line[len("data: "):]))


def _joined(events: list[dict]) -> tuple[str, list, list, str | None]:
    text, tokens, logprobs, finish = "", [], [], None
    for event in events:
        assert "error" not in event, event
        for choice in event["choices"]:
            text += choice["text"]
            tokens += (choice["logprobs"] or {}).get("tokens", [])
            logprobs += (choice["logprobs"] or {}).get("token_logprobs", [])
            finish = choice["finish_reason"] or finish
    return text, tokens, logprobs, finish


async def test_prompt_logprobs_come_once_across_a_migration(workers, start_gateway):
    pool = await workers(2, mock_tokens_per_s=20, mock_ttft_ms=5)
    server = await start_gateway([w.address for w in pool])
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        reference: list[dict] = []
        await _stream(http, BODY, reference)
        seen: list[dict] = []
        task = asyncio.ensure_future(_stream(http, BODY, seen))
        await wait_until(lambda: len(seen) >= 3 or task.done(), timeout=30, message="the prompt and some tokens out")
        assert not task.done(), "the answer ended before the kill"
        victim = next(w for w in pool if server.router.snapshot().get(w.address).in_flight)
        victim.kill()
        await asyncio.wait_for(task, 60)
    want_text, want_tokens, want_logprobs, _ = _joined(reference)
    text, tokens, logprobs, finish = _joined(seen)
    assert text.startswith(BODY["prompt"]) and text.count(BODY["prompt"]) == 1
    assert logprobs.count(None) == 1 and logprobs[0] is None  # the prompt's first token, once
    assert (text, tokens, logprobs) == (want_text, want_tokens, want_logprobs)
    assert finish == "length"
