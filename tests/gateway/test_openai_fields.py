"""Issue #14 through the HTTP front door (mock workers): unknown and refused fields are 400s
naming them, the engine's fields reach the worker as sent, and typed deltas (reasoning, tool
calls, echo text) come back in vLLM's shapes, streamed and whole, through the official client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from vllm_fleet.client.pool import ClientPool
from vllm_fleet.gateway import fields
from vllm_fleet.gateway.fields import Kind
from vllm_fleet.protocol.types import Chunk, GenerateRequest, PromptLogprob, TokenLogprob, ToolCallDelta, Usage
from vllm_fleet.worker.openai.request import build_vllm_request

from gateway_support import MODEL_A, MODEL_B

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CHAT = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL_A, "prompt": "hi", "max_tokens": 2}


class RecordingClient:
    """A worker client that records each request and, when `script(request)` gives chunks,
    answers with them instead of the worker (the gateway formats whatever a worker sends)."""

    def __init__(self, inner, log: list[GenerateRequest], script) -> None:
        self._inner, self._log, self._script = inner, log, script

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def generate(self, request: GenerateRequest, **kwargs):
        self._log.append(request)
        chunks = self._script(request) if self._script else None
        if chunks is None:
            async for chunk in self._inner.generate(request, **kwargs):
                yield chunk
            return
        for chunk in chunks:
            yield chunk


@pytest.fixture
async def recorded(start_gateway, mock_fleet, monkeypatch):
    """(gateway, requests the workers got, scripts): set scripts["answer"] = fn(request) -> chunks."""
    log: list[GenerateRequest] = []
    scripts: dict = {}
    real_get = ClientPool.get

    def get(pool, address):
        return RecordingClient(real_get(pool, address), log, lambda request: scripts.get("answer", lambda r: None)(request))

    monkeypatch.setattr(ClientPool, "get", get)  # before the gateway's router binds its `connect`
    server = await start_gateway([w.address for w in mock_fleet["a"] + mock_fleet["b"]])
    from support import wait_until

    await wait_until(lambda: {MODEL_A, MODEL_B} <= set(server.router.models()), timeout=20, message="models")
    return server, log, scripts


async def _post(server, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return await http.post(path, json=body)


async def test_unknown_field_is_400_naming_it_and_never_reaches_a_worker(recorded):
    server, log, _ = recorded
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        reply = await _post(server, path, {**body, "temperatur": 0.5})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["param"], error["code"], error["type"]) == ("temperatur", "unknown_field", "invalid_request_error")
        assert "temperatur" in error["message"]
    assert log == []
    assert (await _post(server, "/v1/chat/completions", CHAT)).status_code == 200


def _non_default(rule) -> object:
    return {False: True, 1.0: 2.0, 0: 1, "": "x", "tensors": "none", 1: 2}.get(rule.default, 1) \
        if rule.default is not None else {"x": 1}


REFUSED = [(endpoint, name) for endpoint, table in fields.TABLES.items()
           for name, rule in table.items() if rule.kind is Kind.REFUSED]


@pytest.mark.parametrize("endpoint, name", REFUSED, ids=[f"{e}-{n}" for e, n in REFUSED])
async def test_each_refused_field_is_400_naming_it_with_the_reason(recorded, endpoint, name):
    server, log, _ = recorded
    rule = fields.TABLES[endpoint][name]
    path, body = ("/v1/chat/completions", CHAT) if endpoint == "chat" else ("/v1/completions", COMPLETION)
    reply = await _post(server, path, {**body, name: _non_default(rule)})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == name and rule.why in error["message"]
    # Its default value is no request for the feature: served.
    if rule.default is not None:
        assert (await _post(server, path, {**body, name: rule.default})).status_code == 200
    assert (await _post(server, path, {**body, name: None})).status_code == 200


async def test_engine_fields_reach_the_worker_as_sent(recorded):
    server, log, _ = recorded
    extras = {"ignore_eos": True, "min_tokens": 2, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1,
              "logit_bias": {"11": -5}, "stop_token_ids": [7], "include_stop_str_in_output": True,
              "skip_special_tokens": False, "bad_words": ["no"], "allowed_token_ids": [1, 2, 3],
              "truncate_prompt_tokens": 100, "chat_template_kwargs": {"enable_thinking": False},
              "add_generation_prompt": True, "continue_final_message": False, "parallel_tool_calls": False,
              "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
              "tool_choice": {"type": "function", "function": {"name": "f"}},
              "response_format": {"type": "json_object"}, "some_vllm_future": None}
    extras.pop("some_vllm_future")
    body = {**CHAT, **extras, "metadata": {"team": "search"}, "user": "u1", "max_tokens": 4}
    reply = await _post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    [request] = log
    sent = json.loads(request.body.body_json)
    assert request.body.endpoint == "chat"
    assert sent == {**extras, "max_tokens": 4}
    # Messages travel in the envelope as OpenAI dicts; the gateway's own and inert fields stay behind.
    assert not {"messages", "model", "stream", "user", "metadata", "n"} & set(sent)
    assert request.inputs[0].messages == [{"role": "user", "content": "hi"}]
    # vLLM's request model gives them their meaning on the worker.
    p = build_vllm_request(request, request.inputs[0]).to_sampling_params(4, {})
    assert (p.ignore_eos, p.min_tokens, p.top_k, p.stop_token_ids, p.logit_bias) == (True, 2, 5, [7], {11: -5.0})
    assert request.constrained  # json_object and a named tool: a grammar the router must not migrate


@pytest.mark.parametrize("extra, constrained", [
    ({}, False),
    ({"response_format": {"type": "text"}}, False),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}, True),
    ({"structured_outputs": {"regex": "[ab]+"}}, True),
    ({"tools": TOOLS, "tool_choice": "required"}, True),
    ({"tools": TOOLS, "tool_choice": "none"}, False),
    # "auto" (not constrained) needs a worker with --enable-auto-tool-choice: test_translate.py covers its flag.
])
async def test_constrained_flag(recorded, extra, constrained):
    server, log, _ = recorded
    reply = await _post(server, "/v1/chat/completions", {**CHAT, **extra})
    assert reply.status_code == 200, reply.text
    assert log[-1].constrained is constrained


async def test_completion_echo_reaches_the_worker(recorded):
    server, log, _ = recorded
    reply = await _post(server, "/v1/completions", {**COMPLETION, "echo": True, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert log[-1].body.endpoint == "completion"
    assert json.loads(log[-1].body.body_json) == {"echo": True, "ignore_eos": True, "max_tokens": 2}


def _tool_script(request: GenerateRequest) -> list[Chunk]:
    """What a worker with Qwen3's parsers sends: reasoning, then a tool call in pieces."""
    return [
        Chunk(0, 0, "", [1, 2], reasoning="The user wants "),
        Chunk(0, 0, "", [3], reasoning="the weather."),
        Chunk(0, 0, "", [4], tool_calls=[ToolCallDelta(0, id="call_1", name="get_weather")]),
        Chunk(0, 0, "", [5, 6], tool_calls=[ToolCallDelta(0, arguments='{"city": ')]),
        Chunk(0, 0, "", [7], tool_calls=[ToolCallDelta(0, arguments='"Paris"}')], finish_reason="tool_calls",
              usage=Usage(12, 7, 0)),
    ]


async def test_whole_answer_with_reasoning_and_tool_calls(recorded):
    server, _, scripts = recorded
    scripts["answer"] = _tool_script
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    reply = await client.chat.completions.create(model=MODEL_A, messages=[{"role": "user", "content": "weather?"}],
                                                 tools=TOOLS, tool_choice="auto")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning"] == "The user wants the weather."
    [call] = choice.message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_1", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.usage.completion_tokens == 7


async def test_streamed_reasoning_and_tool_calls_with_continuous_usage(recorded):
    server, _, scripts = recorded
    scripts["answer"] = _tool_script
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL_A, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    reasoning, calls, finish, usages = "", {}, None, []
    async for chunk in stream:
        usages.append(chunk.usage)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning") or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or piece.id
            if piece.function is not None:
                call["name"] = call["name"] or piece.function.name
                call["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "The user wants the weather."
    assert calls == {0: {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert finish == "tool_calls"
    # Usage on every event: this choice's tokens so far, then the whole request's.
    assert [u.completion_tokens for u in usages] == [2, 3, 4, 6, 7, 7]
    assert usages[-2].prompt_tokens == 12 and usages[-1].total_tokens == 19


async def test_completion_echo_starts_each_choice_with_the_prompt(recorded):
    server, _, scripts = recorded
    scripts["answer"] = lambda request: [
        Chunk(0, 0, " world", [5], prompt_text="Hello"),
        Chunk(0, 0, "!", [6], finish_reason="length", usage=Usage(1, 2, 0)),
    ]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    whole = await client.completions.create(model=MODEL_A, prompt="Hello", max_tokens=2, echo=True)
    assert whole.choices[0].text == "Hello world!"
    stream = await client.completions.create(model=MODEL_A, prompt="Hello", max_tokens=2, echo=True, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == "Hello world!"


async def test_chat_echo_follows_vllm_rule(recorded):
    """echo repeats the last message only when its role is the answer's (the assistant's, or with
    add_generation_prompt false the last message's own)."""
    server, _, scripts = recorded
    scripts["answer"] = lambda request: [Chunk(0, 0, " and more", [5], finish_reason="stop", usage=Usage(3, 1, 0))]
    history = [{"role": "user", "content": "go on"}, {"role": "assistant", "content": "Once upon a time"}]
    body = {"model": MODEL_A, "messages": history, "echo": True}
    reply = await _post(server, "/v1/chat/completions", {**body, "add_generation_prompt": False,
                                                         "continue_final_message": True})
    assert reply.json()["choices"][0]["message"]["content"] == "Once upon a time and more"
    reply = await _post(server, "/v1/chat/completions", {**body, "messages": history[:1]})
    assert reply.json()["choices"][0]["message"]["content"] == " and more"


async def test_history_with_tool_calls_and_reasoning_travels_as_openai_messages(recorded):
    server, log, _ = recorded
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "need a tool",
                 "refusal": None},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}]
    # tool_choice "none": with tools and no tool_choice vLLM means "auto", which (as under vllm serve)
    # needs a worker started with --enable-auto-tool-choice; these mock workers are not.
    reply = await _post(server, "/v1/chat/completions",
                        {"model": MODEL_A, "messages": messages, "tools": TOOLS, "tool_choice": "none"})
    assert reply.status_code == 200, reply.text
    sent = log[-1].inputs[0].messages
    # The calls stay objects, never re-encoded; the older reasoning_content is sent as reasoning.
    assert sent[1] == {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "need a tool"}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}
    assert json.loads(log[-1].body.body_json) == {"tools": TOOLS, "tool_choice": "none"}


async def test_non_text_content_part_is_400_naming_its_type(recorded):
    server, log, _ = recorded
    part = {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}
    reply = await _post(server, "/v1/chat/completions",
                        {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, part]}]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "messages.0.content.1" and "image_url" in error["message"]
    assert log == []


PROMPT_LPS = [PromptLogprob(1, "Hello", None),
              PromptLogprob(2, " there", -1.25, [(2, " there", -1.25, 3), (9, " world", -0.5, 1), (8, "!", -0.75, 2)])]


async def test_completion_echo_with_logprobs_puts_the_prompts_tokens_first(recorded):
    """vLLM's shape: the prompt's tokens lead the logprobs (the first with nulls), offsets run on
    into the answer, and the choice carries vLLM's own prompt_logprobs field."""
    server, log, scripts = recorded
    scripts["answer"] = lambda request: [
        Chunk(0, 0, " world", [9], prompt_text="Hello there", prompt_logprobs=PROMPT_LPS,
              logprobs=[TokenLogprob(9, " world", -0.5, [(9, " world", -0.5)])]),
        Chunk(0, 0, "!", [8], finish_reason="length", usage=Usage(2, 2, 0),
              logprobs=[TokenLogprob(8, "!", -0.1, [(8, "!", -0.1)])]),
    ]
    body = {**COMPLETION, "prompt": "Hello there", "echo": True, "logprobs": 1}
    whole = (await _post(server, "/v1/completions", body)).json()["choices"][0]
    assert whole["text"] == "Hello there world!"
    assert whole["logprobs"] == {
        "tokens": ["Hello", " there", " world", "!"], "token_logprobs": [None, -1.25, -0.5, -0.1],
        "top_logprobs": [None, {" there": -1.25, " world": -0.5}, {" world": -0.5}, {"!": -0.1}],
        "text_offset": [0, 5, 11, 17]}
    assert whole["prompt_logprobs"] == [None, {"2": {"logprob": -1.25, "rank": 3, "decoded_token": " there"},
                                               "9": {"logprob": -0.5, "rank": 1, "decoded_token": " world"},
                                               "8": {"logprob": -0.75, "rank": 2, "decoded_token": "!"}}]
    assert json.loads(log[-1].body.body_json)["echo"] is True  # vLLM asks itself for the prompt's logprobs
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    stream = await client.completions.create(model=MODEL_A, prompt="Hello there", max_tokens=2, echo=True,
                                             logprobs=1, stream=True)
    events = [c.choices[0] async for c in stream if c.choices]
    assert events[0].text == "Hello there world" and events[0].logprobs.tokens == ["Hello", " there", " world"]
    assert [o for e in events for o in e.logprobs.text_offset] == [0, 5, 11, 17]


async def test_completion_echo_with_max_tokens_0_answers_the_prompt_alone(recorded):
    server, _, scripts = recorded
    scripts["answer"] = lambda request: [
        Chunk(0, 0, " world", [9], prompt_text="Hello there", prompt_logprobs=PROMPT_LPS, finish_reason="length",
              usage=Usage(2, 1, 0), logprobs=[TokenLogprob(9, " world", -0.5, [(9, " world", -0.5)])])]
    body = {**COMPLETION, "prompt": "Hello there", "echo": True, "logprobs": 0, "max_tokens": 0}
    whole = (await _post(server, "/v1/completions", body)).json()["choices"][0]
    assert whole["text"] == "Hello there" and whole["logprobs"]["tokens"] == ["Hello", " there"]
    assert whole["logprobs"]["top_logprobs"] == [None, {" there": -1.25}]  # logprobs 0: the token itself
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    stream = await client.completions.create(model=MODEL_A, prompt="Hello there", max_tokens=0, echo=True,
                                             logprobs=0, stream=True)
    events = [c.choices[0] async for c in stream if c.choices]
    assert "".join(e.text for e in events) == "Hello there"
    assert [t for e in events for t in e.logprobs.tokens] == ["Hello", " there"]


async def test_completion_max_tokens_0_without_echo_is_vllms_400(recorded):
    server, _, _ = recorded
    reply = await _post(server, "/v1/completions", {**COMPLETION, "max_tokens": 0})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens", reply.text
