"""Request bodies → GenerateRequest, and every check made before a worker is touched."""

from __future__ import annotations

import json

import pytest

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.translate import chat_plan, completion_plan, parse_body

CONFIG = GatewayConfig(max_n=4, max_prompts=3)
CONTEXT = 4096


def chat(body: dict, config: GatewayConfig = CONFIG):
    parsed = parse_body(ChatCompletionRequest, json.dumps({"model": "m", **body}).encode())
    return chat_plan(parsed, request_id="r1", session_id="", config=config, max_model_len=CONTEXT)


def completion(body: dict, config: GatewayConfig = CONFIG):
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", **body}).encode())
    return completion_plan(parsed, request_id="r1", session_id="", config=config, max_model_len=CONTEXT)


def refused(call, body: dict) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(body)
    assert info.value.status == 400
    return info.value


MSG = [{"role": "user", "content": "hi"}]


def test_chat_maps_every_sampling_field():
    plan = chat({"messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "n": 2, "stop": "END", "seed": 7, "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9,
                 "presence_penalty": 0.1, "frequency_penalty": -0.2, "logprobs": True, "top_logprobs": 3,
                 "user": "alice", "stream": True, "stream_options": {"include_usage": True}})
    p = plan.request.params
    assert (p.n, p.stop, p.seed, p.max_tokens, p.temperature, p.top_p, p.logprobs) == (2, ["END"], 7, 9, 0.5, 0.9, 3)
    assert (p.presence_penalty, p.frequency_penalty) == (0.1, -0.2)
    # Text parts join with newlines, as vLLM's chat renderer joins them.
    assert [(m.role, m.content) for m in plan.request.inputs[0].messages] == [("system", "be brief"), ("user", "a\nb")]
    assert plan.request.session_id == "alice"
    assert plan.stream and plan.include_usage and plan.kind == "chat"


def test_session_header_wins_over_user():
    parsed = parse_body(ChatCompletionRequest, json.dumps({"model": "m", "messages": MSG, "user": "u"}).encode())
    plan = chat_plan(parsed, request_id="r", session_id="conv-9", config=CONFIG, max_model_len=CONTEXT)
    assert plan.request.session_id == "conv-9"


def test_logprobs_off_unless_asked():
    assert chat({"messages": MSG}).request.params.logprobs is None
    assert chat({"messages": MSG, "logprobs": True}).request.params.logprobs == 0
    assert refused(lambda b: chat(b), {"messages": MSG, "top_logprobs": 2}).param == "top_logprobs"


@pytest.mark.parametrize("prompt, kinds", [
    ("one", ["text"]),
    (["a", "b"], ["text", "text"]),
    ([1, 2, 3], ["token_ids"]),
    ([[1, 2], [3]], ["token_ids", "token_ids"]),
])
def test_completion_prompt_shapes_become_inputs(prompt, kinds):
    plan = completion({"prompt": prompt, "logprobs": 2, "max_tokens": 5})
    assert [i.kind for i in plan.request.inputs] == kinds
    assert plan.request.params.logprobs == 2


@pytest.mark.parametrize("body, param", [
    ({"messages": MSG, "n": 5}, "n"),
    ({"messages": MSG, "n": 0}, "n"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": CONTEXT + 1}, "max_tokens"),
    ({"messages": MSG, "max_tokens": "10"}, "max_tokens"),
    ({"messages": MSG, "temperature": 3}, "temperature"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "x" * (CONTEXT * 8)}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x" * 12000}], "max_tokens": 3000}, "max_tokens"),
])
def test_chat_refusals_name_the_field(body, param):
    assert refused(chat, body).param == param


@pytest.mark.parametrize("body, param", [
    ({"prompt": ["a", "b", "c", "d"]}, "prompt"),
    ({"prompt": list(range(CONTEXT))}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": "x", "suffix": "tail"}, "suffix"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
])
def test_completion_refusals_name_the_field(body, param):
    assert refused(completion, body).param == param


def test_invalid_json_and_non_objects():
    for raw in (b"{", b"", b"[1,2]", b'"text"'):
        with pytest.raises(ApiError) as info:
            parse_body(ChatCompletionRequest, raw)
        assert info.value.status == 400


def test_whole_floats_are_integers_strings_are_not():
    assert chat({"messages": MSG, "n": 2.0, "max_tokens": 5.0}).request.params.n == 2
    assert refused(chat, {"messages": MSG, "n": 2.5}).param == "n"
    assert refused(chat, {"messages": MSG, "n": "2"}).param == "n"


def test_unknown_fields_are_refused_by_name():
    """A field nobody classified is never dropped silently (issue #14)."""
    assert refused(chat, {"messages": MSG, "some_future_option": {"x": 1}}).param == "some_future_option"
    assert refused(completion, {"prompt": "x", "max_token": 5}).param == "max_token"
    error = refused(chat, {"messages": [{"role": "user", "content": "x", "colour": "red"}]})
    assert (error.param, error.code) == ("messages.0.colour", "unknown_field")
    assert refused(chat, {"messages": MSG, "stream": True, "stream_options": {"usage": True}}).param == "stream_options.usage"


def test_unknown_context_skips_only_the_context_guard():
    """With no context length (the model is not served: the router answers 404), the gateway's
    own limits still hold and nothing is refused for length."""
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": "x" * 100_000, "max_tokens": 9000}).encode())
    plan = completion_plan(parsed, request_id="r", session_id="", config=CONFIG, max_model_len=None)
    assert plan.request.params.max_tokens == 9000
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": ["a"] * 4}).encode())
    with pytest.raises(ApiError) as info:
        completion_plan(parsed, request_id="r", session_id="", config=CONFIG, max_model_len=None)
    assert info.value.param == "prompt"
    capped = GatewayConfig(max_tokens_limit=100)
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": "x", "max_tokens": 101}).encode())
    with pytest.raises(ApiError) as info:
        completion_plan(parsed, request_id="r", session_id="", config=capped, max_model_len=None)
    assert info.value.param == "max_tokens"
