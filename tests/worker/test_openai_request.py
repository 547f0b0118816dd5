"""The worker's conversion of requests into vLLM's own models, and its error mapping (no engine).

An OpenAI body becomes vLLM's ChatCompletionRequest / CompletionRequest with the typed inputs;
vLLM's validators name the field they refuse. Typed SamplingParams become vLLM's, Constraint
included. A resumed input's budget comes off vLLM's params too.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import (
    ChatMessage, Constraint, GenerateInput, GenerateRequest, OpenAIOptions, SamplingParams,
)
from vllm_fleet.worker.engines.base import EnginePrompt
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.openai.request import build_vllm_request, request_body
from vllm_fleet.worker.prepare import prepare_input
from vllm_fleet.worker.openai.sampling import truncate_prompt, vllm_sampling_params
from vllm_fleet.worker.validation import Limits, validate_request
from vllm_fleet.worker.openai.render import VllmPrompts

pytest.importorskip("vllm")

USER = [ChatMessage("user", "hi")]


def chat(body: dict, messages: list[ChatMessage] = USER):
    return build_vllm_request(OpenAIOptions("chat", json.dumps(body).encode()), GenerateInput(messages=messages))


def refusal(body: dict, endpoint: str = "chat", item: GenerateInput | None = None) -> InvalidRequestError:
    item = item or GenerateInput(messages=USER)
    with pytest.raises(InvalidRequestError) as refused:
        build_vllm_request(OpenAIOptions(endpoint, json.dumps(body).encode()), item)
    return refused.value


# ------------------------------------------------------------------------------ OpenAI body


def test_messages_carry_their_tool_fields_as_openai_dicts():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [ChatMessage("user", "call f", name="ann"),
                ChatMessage("assistant", "", tool_calls_json=json.dumps(calls), reasoning="f fits"),
                ChatMessage("tool", "42", tool_call_id="c1")]
    body = request_body(OpenAIOptions("chat", b"{}"), GenerateInput(messages=messages))
    assert body["messages"] == [
        {"role": "user", "content": "call f", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning": "f fits"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    request = chat({}, messages)
    assert request.messages[1]["tool_calls"][0]["function"]["name"] == "f"


def test_a_chat_body_becomes_vllms_request_with_its_structured_outputs():
    schema = {"name": "p", "schema": {"type": "object"}}
    request = chat({"response_format": {"type": "json_schema", "json_schema": schema},
                    "chat_template_kwargs": {"enable_thinking": False}, "min_tokens": 3, "ignore_eos": True})
    assert request.min_tokens == 3 and request.ignore_eos
    params = request.to_sampling_params(10, {})
    assert params.structured_outputs.json == {"type": "object"}
    chat_params = request.build_chat_params(None, "auto")
    assert chat_params.chat_template_kwargs["enable_thinking"] is False
    assert chat_params.chat_template_kwargs["add_generation_prompt"] is True


def test_a_completion_takes_its_prompt_from_the_typed_input():
    item = GenerateInput(token_ids=[5, 6, 7])
    request = build_vllm_request(OpenAIOptions("completion", b'{"echo": true}'), item)
    assert request.prompt == [5, 6, 7] and request.echo
    text = build_vllm_request(OpenAIOptions("completion", b"{}"), GenerateInput(text="Once"))
    assert text.prompt == "Once"


@pytest.mark.parametrize("body, param", [
    ({"top_k": "x"}, "top_k"),
    ({"temperature": "hot"}, "temperature"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"tool_choice": "auto"}, "tool_choice"),  # tools missing
    ({"messages": [{"role": "user", "content": "x"}]}, "messages"),  # messages travel typed
])
def test_a_field_vllm_refuses_is_named(body, param):
    error = refusal(body)
    assert error.param == param
    assert str(error)


def test_the_refused_value_is_quoted_in_the_message():
    assert "'x'" in str(refusal({"top_k": "x"}))


@pytest.mark.parametrize("endpoint, body_json, item, param", [
    ("chat", b"{not json", GenerateInput(messages=USER), "openai.body_json"),
    ("chat", b"[1]", GenerateInput(messages=USER), "openai.body_json"),
    ("embeddings", b"{}", GenerateInput(text="x"), "openai.endpoint"),
    ("chat", b"{}", GenerateInput(text="x"), "messages"),
    ("completion", b"{}", GenerateInput(messages=USER), "prompt"),
])
def test_a_request_that_does_not_fit_its_endpoint_is_refused(endpoint, body_json, item, param):
    with pytest.raises(InvalidRequestError) as refused:
        build_vllm_request(OpenAIOptions(endpoint, body_json), item)
    assert refused.value.param == param


def test_tool_calls_that_are_not_json_are_refused():
    messages = [ChatMessage("assistant", "", tool_calls_json="[{")]
    with pytest.raises(InvalidRequestError) as refused:
        request_body(OpenAIOptions("chat", b"{}"), GenerateInput(messages=messages))
    assert refused.value.param == "messages"


# ------------------------------------------------------------------------------ typed params


def test_typed_params_map_to_vllms_with_the_extras_and_stream_deltas():
    from vllm.sampling_params import RequestOutputKind

    typed = SamplingParams(temperature=0.5, max_tokens=20, min_p=0.1, logit_bias={7: 2.0}, bad_words=["bad"],
                           allowed_token_ids=[1, 2, 3], include_stop_str_in_output=True, skip_special_tokens=False,
                           stop=["."], ignore_eos=True)
    params = vllm_sampling_params(typed, {"temperature": 0.9, "top_k": 40})
    assert (params.temperature, params.top_k, params.min_p) == (0.5, 40, 0.1)  # ours over the model's defaults
    assert params.logit_bias == {7: 2.0} and params.bad_words == ["bad"] and params.allowed_token_ids == [1, 2, 3]
    assert params.include_stop_str_in_output and not params.skip_special_tokens and params.ignore_eos
    assert params.output_kind == RequestOutputKind.DELTA and params.structured_outputs is None


@pytest.mark.parametrize("constraint, field, value", [
    (Constraint(json_schema='{"type": "object"}'), "json", {"type": "object"}),
    (Constraint(json_object=True), "json_object", True),
    (Constraint(regex="[0-9]+"), "regex", "[0-9]+"),
    (Constraint(choice=["a", "b"]), "choice", ["a", "b"]),
    (Constraint(grammar='root ::= "x"'), "grammar", 'root ::= "x"'),
    (Constraint(structural_tag='{"type": "structural_tag"}'), "structural_tag", '{"type": "structural_tag"}'),
])
def test_each_constraint_kind_becomes_vllms_structured_outputs(constraint, field, value):
    params = vllm_sampling_params(SamplingParams(constraint=constraint), {})
    assert getattr(params.structured_outputs, field) == value


@pytest.mark.parametrize("constraint", [
    Constraint(), Constraint(json_schema="{no"), Constraint(structural_tag="nope"), Constraint(choice=[]),
    Constraint(regex="a", grammar="b"),
])
def test_a_constraint_that_is_not_one_valid_kind_is_refused_naming_it(constraint):
    with pytest.raises(InvalidRequestError) as refused:
        vllm_sampling_params(SamplingParams(constraint=constraint), {})
    assert refused.value.param == "constraint"


def test_a_value_vllm_refuses_becomes_an_invalid_request():
    with pytest.raises(InvalidRequestError, match="min_p"):
        vllm_sampling_params(SamplingParams(min_p=5.0), {})


def test_truncate_prompt_keeps_the_last_tokens():
    assert truncate_prompt([1, 2, 3, 4], 2, 100, 10) == [3, 4]
    assert truncate_prompt([1, 2, 3, 4], None, 100, 10) == [1, 2, 3, 4]
    assert truncate_prompt(list(range(20)), -1, 16, 10) == list(range(14, 20))  # room for the answer
    with pytest.raises(InvalidRequestError):
        truncate_prompt([1], -2, 100, 10)


# ------------------------------------------------------------------------------ where the checks run

LIMITS = Limits(max_n=4, max_inputs=8, max_logprobs=5)


def test_an_openai_request_meets_the_workers_limits_but_vllms_ranges():
    body = OpenAIOptions("chat", b'{"temperature": 3.0}')
    wide = GenerateRequest("r", [GenerateInput(messages=USER)], SamplingParams(temperature=3.0), openai=body)
    validate_request(wide, LIMITS)  # vLLM, not a stricter rule of ours, decides temperature
    too_many = GenerateRequest("r", [GenerateInput(messages=USER)], SamplingParams(n=9), openai=body)
    with pytest.raises(InvalidRequestError) as refused:
        validate_request(too_many, LIMITS)
    assert refused.value.param == "n"


async def test_the_mock_checks_an_openai_requests_typed_fields_itself():
    engine = MockEngine(EngineConfig(engine="mock"))
    request = GenerateRequest("r", [GenerateInput(messages=USER)], SamplingParams(temperature=3.0),
                              openai=OpenAIOptions("chat", b"{}"))
    with pytest.raises(InvalidRequestError) as refused:
        await engine.prepare(request.inputs[0], request)
    assert refused.value.param == "temperature"


class _VllmShapedEngine(MockEngine):
    """The mock's tokenizer, with vLLM's SamplingParams as its engine params (as VllmEngine makes them)."""

    async def prepare(self, item, request):
        return EnginePrompt(await self.tokenize(item), vllm_sampling_params(request.params, {}))


async def test_a_resumed_input_spends_its_tokens_from_vllms_params():
    engine = _VllmShapedEngine(EngineConfig(engine="mock"))
    resume = (await engine.tokenize(GenerateInput(text="the river city")))
    item = GenerateInput(text="one two three", resume_token_ids=resume)
    request = GenerateRequest("r", [item], SamplingParams(max_tokens=10, min_tokens=5))
    prepared = await prepare_input(engine, 0, request)
    assert (prepared.engine_params.max_tokens, prepared.engine_params.min_tokens) == (7, 2)
    assert prepared.prompt_token_ids[-3:] == resume and prepared.prompt_len == 3


@pytest.mark.parametrize("body", [{"chat_template": "{{ 'x' }}"}, {"chat_template_kwargs": {"chat_template": "x"}}])
async def test_a_request_may_not_bring_its_own_chat_template(body):
    """As vllm serve without --trust-request-chat-template; refused before anything is rendered."""
    model_config = SimpleNamespace(generation_config="auto", max_model_len=2048)
    llm = SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config))
    prompts = VllmPrompts(llm, object(), {}, parser_cls=None, enable_auto_tool_choice=False)
    request = GenerateRequest("r", [GenerateInput(messages=USER)],
                              openai=OpenAIOptions("chat", json.dumps(body).encode()))
    with pytest.raises(InvalidRequestError) as refused:
        await prompts.prepare(request.inputs[0], request)
    assert refused.value.param == "chat_template"


async def test_the_typed_n_frames_an_openai_request_as_the_router_resumes_one_sample():
    """Migration of an n=3 request resumes each sample alone: typed n=1, body still n=3."""
    model_config = SimpleNamespace(generation_config="auto", max_model_len=2048, is_encoder_decoder=False)
    renderer = SimpleNamespace()

    async def render_cmpl_async(prompts, tok_params):
        return [{"type": "token", "prompt_token_ids": [5, 6, 7]}]

    renderer.render_cmpl_async = render_cmpl_async
    llm = SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config), renderer=renderer)
    prompts = VllmPrompts(llm, object(), {}, parser_cls=None, enable_auto_tool_choice=False)
    request = GenerateRequest("r", [GenerateInput(token_ids=[5, 6, 7])], SamplingParams(n=1),
                              openai=OpenAIOptions("completion", b'{"n": 3, "max_tokens": 4}'))
    prompt = await prompts.prepare(request.inputs[0], request)
    assert prompt.params.n == 1 and prompt.params.max_tokens == 4 and prompt.prompt_token_ids == [5, 6, 7]
