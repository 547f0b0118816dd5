"""Request bodies → GenerateRequest, and every check made before a worker is touched."""

from __future__ import annotations

import json

import pytest

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.translate import chat_plan, completion_plan, parse_body
from vllm_fleet.worker.openai.request import build_vllm_request

CONFIG = GatewayConfig(max_n=4, max_prompts=3)
CONTEXT = 4096


def chat(body: dict, config: GatewayConfig = CONFIG):
    parsed = parse_body(ChatCompletionRequest, json.dumps({"model": "m", **body}).encode())
    return chat_plan(parsed, request_id="r1", session_id="", config=config, max_model_len=CONTEXT)


def completion(body: dict, config: GatewayConfig = CONFIG):
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", **body}).encode())
    return completion_plan(parsed, request_id="r1", session_id="", config=config, max_model_len=CONTEXT)


def sent(plan) -> dict:
    """The request body the worker gets: vLLM's OpenAI shape, without what the envelope carries."""
    return json.loads(plan.request.body.body_json)


def refused(call, body: dict) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(body)
    assert info.value.status == 400
    return info.value


MSG = [{"role": "user", "content": "hi"}]


def test_chat_forwards_every_sampling_field_as_sent():
    plan = chat({"messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "n": 2, "stop": "END", "seed": 7, "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9,
                 "presence_penalty": 0.1, "frequency_penalty": -0.2, "logprobs": True, "top_logprobs": 3,
                 "user": "alice", "stream": True, "stream_options": {"include_usage": True}})
    assert plan.request.body.endpoint == "chat"
    # As the client wrote them (a single stop string stays a string: vLLM reads it); n is the envelope's.
    assert sent(plan) == {"stop": "END", "seed": 7, "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9,
                          "presence_penalty": 0.1, "frequency_penalty": -0.2, "logprobs": True, "top_logprobs": 3}
    assert (plan.request.n, plan.n, plan.logprobs, plan.request.hints.max_tokens) == (2, 2, 3, 9)
    # Text parts join with newlines, as vLLM's chat renderer joins them; messages travel as OpenAI dicts.
    assert plan.request.inputs[0].messages == [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "a\nb"}]
    assert plan.request.session_id == "alice"
    assert plan.stream and plan.include_usage and plan.kind == "chat"


def test_the_gateway_s_own_and_inert_fields_stay_behind():
    plan = chat({"messages": MSG, "user": "u", "session_id": "s", "request_id": "mine", "stream": True,
                 "stream_options": {"include_usage": True}, "metadata": {"team": "x"}, "store": False, "echo": False})
    assert sent(plan) == {}
    plan = completion({"prompt": "x", "echo": True, "ignore_eos": True, "max_tokens": 2})
    assert plan.request.body.endpoint == "completion"
    assert sent(plan) == {"echo": True, "ignore_eos": True, "max_tokens": 2}  # completion echo is the engine's


def test_max_completion_tokens_wins_over_max_tokens_in_the_routing_hint():
    """Both go to vLLM as sent (it reads max_completion_tokens first); the router's hint says the same."""
    plan = chat({"messages": MSG, "max_tokens": 50, "max_completion_tokens": 9})
    assert sent(plan) == {"max_tokens": 50, "max_completion_tokens": 9}
    assert plan.request.hints.max_tokens == 9
    assert chat({"messages": MSG, "max_tokens": 50}).request.hints.max_tokens == 50
    assert chat({"messages": MSG}).request.hints.max_tokens is None
    assert completion({"prompt": "x", "max_tokens": 12}).request.hints.max_tokens == 12
    # The gateway's limits apply to the one that counts.
    assert refused(chat, {"messages": MSG, "max_tokens": 5, "max_completion_tokens": CONTEXT + 1}).param == "max_tokens"
    vllm_request = build_vllm_request(plan.request, plan.request.inputs[0])
    assert vllm_request.max_completion_tokens == 9


@pytest.mark.parametrize("call, body", [
    (chat, {"messages": MSG, "n": 3, "priority": -5, "temperature": 0.7}),
    (completion, {"prompt": ["a", "b"], "n": 3, "priority": -5, "temperature": 0.7}),
])
def test_n_and_priority_travel_in_the_envelope_not_the_body(call, body):
    plan = call(body)
    assert (plan.request.n, plan.request.priority) == (3, -5)
    assert sent(plan) == {"temperature": 0.7}
    # The worker puts them into vLLM's request model from the envelope.
    vllm_request = build_vllm_request(plan.request, plan.request.inputs[0])
    assert (vllm_request.n, vllm_request.priority) == (3, -5)


def test_defaults_leave_the_envelope_plain():
    plan = chat({"messages": MSG})
    assert (plan.request.n, plan.request.priority, plan.request.constrained, sent(plan)) == (1, 0, False, {})


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, "1", 1.5, True])
def test_priority_must_be_a_32_bit_integer(priority):
    assert refused(chat, {"messages": MSG, "priority": priority}).param == "priority"


@pytest.mark.parametrize("raw, param", [
    (b'"min_p": NaN', "min_p"),
    (b'"repetition_penalty": Infinity', "repetition_penalty"),
    (b'"logit_bias": {"5": -Infinity}', "logit_bias"),
    (b'"temperature": NaN', "temperature"),
])
def test_nan_and_infinity_are_refused_not_forwarded(raw, param):
    """Python's JSON reader takes NaN; the body would carry it as a non-number (or null): refused by name."""
    parsed_body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], ' + raw + b"}"
    with pytest.raises(ApiError) as info:
        chat_plan(parse_body(ChatCompletionRequest, parsed_body), request_id="r1", session_id="", config=CONFIG,
                  max_model_len=CONTEXT)
    assert (info.value.status, info.value.param) == (400, param)


@pytest.mark.parametrize("extra, constrained", [
    ({}, False),
    ({"response_format": {"type": "text"}}, False),
    ({"response_format": {"type": "json_object"}}, True),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}, True),
    ({"structured_outputs": {"regex": "[ab]+"}}, True),
    ({"tool_choice": "required"}, True),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, True),
    ({"tool_choice": "auto"}, False),
    ({"tool_choice": "none"}, False),
])
def test_constrained_flag_follows_the_body(extra, constrained):
    """A grammar-constrained stream must not migrate after its first token: the router reads the flag."""
    assert chat({"messages": MSG, **extra}).request.constrained is constrained


def test_session_header_wins_over_user():
    parsed = parse_body(ChatCompletionRequest, json.dumps({"model": "m", "messages": MSG, "user": "u"}).encode())
    plan = chat_plan(parsed, request_id="r", session_id="conv-9", config=CONFIG, max_model_len=CONTEXT)
    assert plan.request.session_id == "conv-9"


def test_logprobs_off_unless_asked():
    assert chat({"messages": MSG}).logprobs is None and "logprobs" not in sent(chat({"messages": MSG}))
    plan = chat({"messages": MSG, "logprobs": True})
    assert (plan.logprobs, sent(plan)) == (0, {"logprobs": True})
    # top_logprobs without logprobs: vLLM's rule, so the worker's vLLM request model refuses it by name.
    plan = chat({"messages": MSG, "top_logprobs": 2})
    assert (plan.logprobs, sent(plan)) == (None, {"top_logprobs": 2})
    with pytest.raises(InvalidRequestError) as info:
        build_vllm_request(plan.request, plan.request.inputs[0])
    assert info.value.param == "top_logprobs"


@pytest.mark.parametrize("prompt, kinds", [
    ("one", ["text"]),
    (["a", "b"], ["text", "text"]),
    ([1, 2, 3], ["token_ids"]),
    ([[1, 2], [3]], ["token_ids", "token_ids"]),
])
def test_completion_prompt_shapes_become_inputs(prompt, kinds):
    plan = completion({"prompt": prompt, "logprobs": 2, "max_tokens": 5})
    assert [i.kind for i in plan.request.inputs] == kinds
    assert plan.logprobs == 2
    assert sent(plan) == {"logprobs": 2, "max_tokens": 5}  # the prompt is the envelope's, one input each
    assert plan.request.body.endpoint == "completion"


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
    plan = chat({"messages": MSG, "n": 2.0, "max_tokens": 5.0})
    assert (plan.request.n, sent(plan), plan.request.hints.max_tokens) == (2, {"max_tokens": 5}, 5)
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
    assert (sent(plan), plan.request.hints.max_tokens) == ({"max_tokens": 9000}, 9000)
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": ["a"] * 4}).encode())
    with pytest.raises(ApiError) as info:
        completion_plan(parsed, request_id="r", session_id="", config=CONFIG, max_model_len=None)
    assert info.value.param == "prompt"
    capped = GatewayConfig(max_tokens_limit=100)
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": "x", "max_tokens": 101}).encode())
    with pytest.raises(ApiError) as info:
        completion_plan(parsed, request_id="r", session_id="", config=capped, max_model_len=None)
    assert info.value.param == "max_tokens"


@pytest.mark.parametrize("tier, service_class", [(None, "interactive"), ("default", "interactive"),
                                                 ("auto", "interactive"), ("flex", "batch")])
def test_service_tier_flex_runs_as_batch_and_is_not_sent_to_the_engine(tier, service_class):
    body = {"messages": MSG} if tier is None else {"messages": MSG, "service_tier": tier}
    plan = chat(body)
    assert plan.request.hints.service_class == service_class
    assert "service_tier" not in sent(plan)


def test_an_unknown_service_tier_is_refused_naming_it():
    assert refused(chat, {"messages": MSG, "service_tier": "bulk"}).param == "service_tier"


@pytest.mark.parametrize("call, body", [
    (chat, {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1, "stream": True}),
    (completion, {"prompt": "x", "prompt_logprobs": 2, "stream": True}),
])
def test_prompt_logprobs_on_a_stream_are_refused_as_vllm_does(call, body):
    # The worker always streams, so vLLM's own check cannot see the client's stream flag.
    assert refused(call, body).param == "prompt_logprobs"


def test_echo_with_logprobs_and_max_tokens_0_is_served():
    plan = completion({"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0})
    assert plan.echo and plan.echo_only and plan.logprobs == 1
