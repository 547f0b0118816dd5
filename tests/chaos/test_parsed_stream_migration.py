"""kill -9 of the worker streaming a parsed answer (reasoning, content, a tool call) mid-call.

Two mock workers answer with the same script through vLLM's qwen3 reasoning parser and hermes
tool parser, on real token ids. The stream migrates to the survivor, whose parsers are primed
with the tokens the client already has: the client's reasoning, content and tool-call
arguments must equal an uninterrupted run's, with no token lost or repeated.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from chaos_support import router_for
from parser_tokenizer import parser_tokenizer_dir  # noqa: F401  (fixture)
from support import wait_until
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, GenerateRequest
from vllm_fleet.router import RouterConfig

pytestmark = pytest.mark.timeout(300)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "note": {"type": "string"}}, "required": ["city"]}}}]
ARGUMENTS = {"city": "Zürich", "note": "include the old town, the lake shore, the hills around it and the "
                                       "river banks, with an hourly forecast for each of them"}
SCRIPT = ("<think>The user wants the weather; I should call get_weather.</think>Let me look that up."
          f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': ARGUMENTS})}\n</tool_call>")


class Seen:
    """What the client has of the stream so far."""

    def __init__(self) -> None:
        self.content = self.reasoning = ""
        self.token_ids: list[int] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None

    def add(self, chunk) -> None:
        self.content += chunk.text
        self.reasoning += chunk.reasoning
        self.token_ids += chunk.token_ids
        for piece in chunk.tool_calls or ():
            call = self.calls.setdefault(piece.index, {"name": "", "arguments": ""})
            call["name"] += piece.name
            call["arguments"] += piece.arguments
        self.finish_reason = chunk.finish_reason or self.finish_reason


def chat_request(request_id: str) -> GenerateRequest:
    body = {"model": "chaos", "tools": TOOLS}
    return build_request(request_id, [GenerateInput(messages=[ChatMessage("user", "Weather in Zürich?")])],
                         SamplingParams(max_tokens=500), extra_body=body)


async def consume(stream, seen: Seen) -> Seen:
    async for chunk in stream:
        seen.add(chunk)
    return seen


async def test_kill_9_mid_tool_call_the_parsed_stream_continues_byte_for_byte(mock_worker_factory, tmp_path,
                                                                            parser_tokenizer_dir):  # noqa: F811
    script = tmp_path / "answer.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    options = dict(served_model_name="chaos", mock_tokenizer=str(parser_tokenizer_dir), mock_script=str(script),
                   tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3",
                   mock_tokens_per_s=25, mock_ttft_ms=5, timeout=180)
    pool = await mock_worker_factory.start_many(2, **options)
    async with router_for([w.address for w in pool], RouterConfig(retry_budget_min_per_s=100)) as router:
        await wait_until(lambda: len(router.models()) == 1 and all(v.state == "serving" for v in router.snapshot()),
                         timeout=20, message="both workers serving")
        seen = Seen()
        task = asyncio.ensure_future(consume(router.stream(chat_request("migrated")), seen))
        # Kill while the tool call's arguments are streaming: the hardest place to resume a parser.
        await wait_until(lambda: bool(seen.calls) and len(seen.calls[0]["arguments"]) > 5 or task.done(),
                         timeout=60, message="the tool call's arguments to start streaming")
        assert not task.done(), "the answer finished before the fault: make the script longer"
        [victim] = [w for w in pool if router.snapshot().get(w.address).in_flight]
        victim.kill()
        migrated = await task
        whole = await consume(router.stream(chat_request("uninterrupted")), Seen())

    assert (migrated.reasoning, migrated.content) == (whole.reasoning, whole.content)
    assert migrated.reasoning == "The user wants the weather; I should call get_weather."
    assert migrated.content == "Let me look that up."
    assert migrated.calls == whole.calls
    assert migrated.calls[0]["name"] == "get_weather"
    assert json.loads(migrated.calls[0]["arguments"]) == ARGUMENTS
    assert migrated.token_ids == whole.token_ids  # no token lost or repeated
    assert migrated.finish_reason == whole.finish_reason == "tool_calls"
