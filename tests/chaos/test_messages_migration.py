"""A Messages stream whose worker is killed (kill -9) mid-answer, on mock workers: it continues on
the other worker with no text lost or repeated, in Anthropic's events; a forced-tool (constrained)
one cannot continue exactly and ends with Anthropic's error event saying so."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from support import wait_until

pytestmark = pytest.mark.timeout(120)

ASK = [{"role": "user", "content": "tell me a long story about migrating streams"}]


async def _stream(http: httpx.AsyncClient, body: dict, deltas: list) -> list[tuple[str, dict]]:
    """Every (event, data) of a streamed Messages answer; `deltas` fills as they arrive."""
    events = []
    async with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, await reply.aread()
        name = None
        async for line in reply.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                events.append((name, data))
                if name == "content_block_delta":
                    deltas.append(data["delta"])
    return events


async def _kill_mid_answer(server, pool, deltas: list, task: asyncio.Task) -> None:
    await wait_until(lambda: len(deltas) >= 3 or task.done(), timeout=30, message="three deltas out")
    assert not task.done(), "the answer ended before the kill"
    victim = next(w for w in pool if server.router.snapshot().get(w.address).in_flight)
    victim.kill()


async def test_a_killed_messages_stream_continues_on_the_other_worker(workers, start_gateway):
    pool = await workers(2, mock_tokens_per_s=20, mock_ttft_ms=5)
    server = await start_gateway([w.address for w in pool])
    body = {"model": "chaos", "max_tokens": 40, "messages": ASK}
    deltas: list = []
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        task = asyncio.ensure_future(_stream(http, body, deltas))
        await _kill_mid_answer(server, pool, deltas, task)
        events = await asyncio.wait_for(task, 60)
        reference = (await http.post("/v1/messages", json=body)).json()  # the survivor, uninterrupted
    names = [name for name, _ in events]
    assert "error" not in names
    assert names[:2] == ["message_start", "content_block_start"] and names[-2:] == ["message_delta", "message_stop"]
    text = "".join(d["text"] for d in deltas)
    assert text == reference["content"][0]["text"], "text was lost or repeated across the kill"
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == reference["stop_reason"]
    assert final["usage"]["output_tokens"] == reference["usage"]["output_tokens"]


async def test_a_killed_forced_tool_stream_ends_with_an_anthropic_error_event(workers, start_gateway):
    pool = await workers(2, mock_tokens_per_s=20, mock_ttft_ms=5)
    server = await start_gateway([w.address for w in pool])
    tool = {"name": "tell", "input_schema": {"type": "object", "properties": {"story": {"type": "string"}}}}
    body = {"model": "chaos", "max_tokens": 60, "messages": ASK, "tools": [tool],
            "tool_choice": {"type": "tool", "name": "tell"}}
    deltas: list = []
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        task = asyncio.ensure_future(_stream(http, body, deltas))
        await _kill_mid_answer(server, pool, deltas, task)
        events = await asyncio.wait_for(task, 60)
    name, data = events[-1]
    assert name == "error" and data["error"]["type"] == "api_error"
    assert "retry the request" in data["error"]["message"]
    assert "message_stop" not in [n for n, _ in events], "the answer went on after the error"
