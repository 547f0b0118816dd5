"""A request's body and envelope as vLLM's own request model, and what vLLM's refusals become (no model).

The body (vLLM's OpenAI shape) plus the envelope's input, n and priority become one
ChatCompletionRequest / CompletionRequest; vLLM's validators, then its SamplingParams, judge every
value, and a refusal names the field in `param` with vLLM's words saying what to change. The
mock engine goes through the same preparation (prepare.py), so it stands in for the real one here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import Constraint, SamplingParams, build_request
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, GenerateRequest, RequestBody
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.openai.request import build_vllm_request, request_fields
from vllm_fleet.worker.prepare import PreparedInput, prepare_input
from vllm_fleet.worker.validation import Limits, validate_request

pytest.importorskip("vllm")

USER = [ChatMessage("user", "hi")]
MAX_LOGPROBS = 5


def raw(endpoint: str, body: dict | bytes, item: GenerateInput, **envelope) -> GenerateRequest:
    """A request as it arrives on the wire, whatever its body holds."""
    body_json = body if isinstance(body, bytes) else json.dumps(body).encode()
    return GenerateRequest("r", [item], RequestBody(endpoint, body_json), **envelope)


def refusal(request: GenerateRequest) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as refused:
        build_vllm_request(request, request.inputs[0])
    return refused.value


@pytest.fixture(scope="module")
async def engine():
    engine = MockEngine(EngineConfig(engine="mock"))
    await engine.start()
    return engine


async def prepared(engine: MockEngine, request: GenerateRequest) -> PreparedInput:
    return await prepare_input(engine, 0, request, max_logprobs=MAX_LOGPROBS)


async def prepare_refusal(engine: MockEngine, request: GenerateRequest) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as refused:
        await prepared(engine, request)
    return refused.value


# ------------------------------------------------------------------------------ body + envelope


def test_chat_messages_come_from_the_envelope_with_their_tool_fields():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [ChatMessage("user", "call f", name="ann"),
                ChatMessage("assistant", None, tool_calls=calls, reasoning="f fits"),
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    request = build_request("r", [GenerateInput(messages=messages)], SamplingParams(n=2, max_tokens=5))
    fields = request_fields(request, request.inputs[0])
    assert fields["messages"] == [
        {"role": "user", "content": "call f", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning": "f fits"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    assert (fields["n"], fields["max_tokens"]) == (2, 5) and "priority" not in fields
    vllm_request = build_vllm_request(request, request.inputs[0])
    assert vllm_request.messages[1]["tool_calls"][0]["function"]["name"] == "f"
    assert vllm_request.n == 2


def test_a_completion_takes_its_prompt_and_priority_from_the_envelope():
    tokens = raw("completion", {"echo": True}, GenerateInput(token_ids=[5, 6, 7]), priority=3)
    fields = request_fields(tokens, tokens.inputs[0])
    assert (fields["prompt"], fields["priority"]) == ([5, 6, 7], 3)
    request = build_vllm_request(tokens, tokens.inputs[0])
    assert request.prompt == [5, 6, 7] and request.echo and request.priority == 3
    text = build_request("r", [GenerateInput(text="Once")])
    assert build_vllm_request(text, text.inputs[0]).prompt == "Once"


def test_a_chat_body_becomes_vllms_request_with_its_structured_outputs():
    schema = {"name": "p", "schema": {"type": "object"}}
    request = build_request("r", [GenerateInput(messages=USER)], SamplingParams(min_tokens=3, ignore_eos=True),
                            extra_body={"response_format": {"type": "json_schema", "json_schema": schema},
                                        "chat_template_kwargs": {"enable_thinking": False}})
    vllm_request = build_vllm_request(request, request.inputs[0])
    assert vllm_request.min_tokens == 3 and vllm_request.ignore_eos
    assert vllm_request.to_sampling_params(10, {}).structured_outputs.json == {"type": "object"}
    chat_params = vllm_request.build_chat_params(None, "auto")
    assert chat_params.chat_template_kwargs["enable_thinking"] is False
    assert chat_params.chat_template_kwargs["add_generation_prompt"] is True


@pytest.mark.parametrize("field, value", [
    ("messages", [{"role": "user", "content": "x"}]), ("prompt", "x"), ("n", 3), ("priority", 1),
])
def test_a_body_carrying_what_the_envelope_carries_is_refused_naming_the_field(field, value):
    if field == "prompt":
        request = raw("completion", {field: value}, GenerateInput(text="x"))
    else:
        request = raw("chat", {field: value}, GenerateInput(messages=USER))
    error = refusal(request)
    assert error.param == field
    assert f"the request body carries '{field}'; it travels in" in str(error)


@pytest.mark.parametrize("endpoint, body_json, item, param, words", [
    ("chat", b"{not json", GenerateInput(messages=USER), "body", "not JSON"),
    ("chat", b"[1]", GenerateInput(messages=USER), "body", "must be a JSON object"),
    ("embeddings", b"{}", GenerateInput(text="x"), "body.endpoint", "use one of chat, completion"),
    ("chat", b"{}", GenerateInput(text="x"), "messages", "needs messages as its input"),
    ("completion", b"{}", GenerateInput(messages=USER), "prompt", "takes a prompt (text or token ids), not messages"),
])
def test_a_request_that_does_not_fit_its_endpoint_is_refused(endpoint, body_json, item, param, words):
    error = refusal(raw(endpoint, body_json, item))
    assert error.param == param
    assert words in str(error)


# ------------------------------------------------------------------------------ vLLM's refusals


@pytest.mark.parametrize("body, param", [
    ({"top_k": "x"}, "top_k"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"tool_choice": "auto"}, "tool_choice"),  # tools missing
])
def test_a_field_vllms_request_model_refuses_is_named(body, param):
    error = refusal(raw("chat", body, GenerateInput(messages=USER)))
    assert error.param == param
    assert str(error)


def test_the_refused_value_is_quoted_in_the_message():
    assert "'x'" in str(refusal(raw("chat", {"top_k": "x"}, GenerateInput(messages=USER))))


def test_a_malformed_message_is_refused_by_vllm():
    error = refusal(raw("chat", {}, GenerateInput(messages=[{"role": "assistant", "content": "", "tool_calls": "[{"}])))
    assert "valid dictionary" in str(error)
    assert error.param == "messages"  # the error sits inside an input, whose location starts at an index


# (typed parameters, the field, words of vLLM's message). vLLM's SamplingParams judges these
# values; the worker has no rules of its own for them.
VALUE_REFUSALS = [
    (dict(max_tokens=0), "max_tokens", "max_tokens must be at least 1"),
    (dict(temperature=2.5), "temperature", "temperature must be in [0, 2]"),
    (dict(temperature=-1), "temperature", "temperature must be non-negative"),
    (dict(top_p=0), "top_p", "top_p must be in (0, 1]"),
    (dict(min_p=5.0), "min_p", "min_p must be in [0, 1]"),
    (dict(top_k=-2), "top_k", "top_k must be 0 (disable), or at least 1"),
    (dict(min_tokens=-1), "min_tokens", "min_tokens must be greater than or equal to 0"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens", "min_tokens must be less than or equal to max_tokens=4"),
    (dict(presence_penalty=2.1), "presence_penalty", "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-3), "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
    (dict(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be greater than zero"),
    (dict(stop=["ok", ""]), "stop", "stop cannot contain an empty string"),
]


@pytest.mark.parametrize("endpoint", ["completion", "chat"])
@pytest.mark.parametrize("params, param, words", VALUE_REFUSALS, ids=[w for _, _, w in VALUE_REFUSALS])
async def test_a_value_vllm_refuses_is_an_invalid_request_in_vllms_words(engine, endpoint, params, param, words):
    item = GenerateInput(messages=USER) if endpoint == "chat" else GenerateInput(text="x")
    error = await prepare_refusal(engine, build_request("r", [item], SamplingParams(**params)))
    assert words in str(error)
    assert not error.recoverable
    assert error.param == param  # vLLM names it, or its message starts with it


async def test_the_edges_of_vllms_ranges_are_accepted(engine):
    for params in [dict(temperature=0), dict(temperature=2), dict(top_p=1), dict(top_k=-1), dict(top_k=0),
                   dict(min_p=0), dict(min_p=1), dict(logprobs=0), dict(logprobs=MAX_LOGPROBS),
                   dict(min_tokens=4, max_tokens=4), dict(presence_penalty=-2), dict(frequency_penalty=2),
                   dict(repetition_penalty=2), dict(max_tokens=1)]:
        await prepared(engine, build_request("r", [GenerateInput(text="x")], SamplingParams(**params)))


@pytest.mark.parametrize("item", [GenerateInput(text="x"), GenerateInput(messages=USER)], ids=["completion", "chat"])
async def test_logprobs_beyond_the_workers_bound_are_refused_on_vllms_value(engine, item):
    """Chat says it as logprobs + top_logprobs, completion as logprobs: the bound applies to what vLLM read."""
    error = await prepare_refusal(engine, build_request("r", [item], SamplingParams(logprobs=MAX_LOGPROBS + 1)))
    assert error.param == "logprobs"
    assert f"logprobs must be between 0 and {MAX_LOGPROBS} (got {MAX_LOGPROBS + 1})" in str(error)


async def test_the_workers_limits_and_vllms_ranges_are_checked_each_in_its_own_layer(engine):
    limits = Limits(max_n=4, max_inputs=8, max_logprobs=MAX_LOGPROBS)
    hot = build_request("r", [GenerateInput(messages=USER)], SamplingParams(temperature=3.0))
    validate_request(hot, limits, schedules_by_priority=False)  # vLLM, not a rule of ours, decides temperature
    error = await prepare_refusal(engine, hot)
    assert (error.param, "temperature must be in [0, 2]" in str(error)) == ("temperature", True)
    too_many = build_request("r", [GenerateInput(messages=USER)], SamplingParams(n=9))
    with pytest.raises(InvalidRequestError) as refused:
        validate_request(too_many, limits, schedules_by_priority=False)
    assert refused.value.param == "n"


# ------------------------------------------------------------------------------ typed params


async def test_typed_params_reach_the_engine_as_vllms_over_the_models_defaults_streaming_deltas(engine):
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    typed = SamplingParams(temperature=0.5, max_tokens=20, min_p=0.1, logit_bias={7: 2.0}, bad_words=["bad"],
                           allowed_token_ids=[4, 5, 6], include_stop_str_in_output=True, skip_special_tokens=False,
                           stop=["."], ignore_eos=True, seed=11)
    engine_defaults, engine.sampling_defaults = engine.sampling_defaults, {"temperature": 0.9, "top_k": 40}
    try:
        params = (await prepared(engine, build_request("r", [GenerateInput(text="x")], typed))).engine_params
    finally:
        engine.sampling_defaults = engine_defaults
    assert isinstance(params, VllmSamplingParams)
    assert (params.temperature, params.top_k, params.min_p) == (0.5, 40, 0.1)  # ours over the model's defaults
    assert params.logit_bias == {7: 2.0} and params.bad_words == ["bad"] and params.allowed_token_ids == [4, 5, 6]
    assert params.include_stop_str_in_output and not params.skip_special_tokens and params.ignore_eos
    assert (params.stop, params.seed, params.max_tokens) == (["."], 11, 20)
    assert params.output_kind == RequestOutputKind.DELTA and params.structured_outputs is None


STRUCTURAL_TAG = '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}'


@pytest.mark.parametrize("constraint, field, value", [
    (Constraint(json_schema='{"type": "object"}'), "json", {"type": "object"}),
    (Constraint(json_object=True), "json_object", True),
    (Constraint(regex="[0-9]+"), "regex", "[0-9]+"),
    (Constraint(choice=["a", "b"]), "choice", ["a", "b"]),
    (Constraint(grammar='root ::= "x"'), "grammar", 'root ::= "x"'),
    (Constraint(structural_tag=STRUCTURAL_TAG), "structural_tag", STRUCTURAL_TAG),
])
async def test_each_constraint_kind_becomes_vllms_structured_outputs(engine, constraint, field, value):
    request = build_request("r", [GenerateInput(text="x")], SamplingParams(constraint=constraint))
    assert request.constrained  # such a stream must not migrate after its first token
    params = (await prepared(engine, request)).engine_params
    assert getattr(params.structured_outputs, field) == value


def test_a_structural_tag_vllm_cannot_compile_is_refused_naming_structured_outputs():
    request = build_request("r", [GenerateInput(text="x")],
                            SamplingParams(constraint=Constraint(structural_tag='{"type": "structural_tag"}')))
    error = refusal(request)
    assert error.param == "structured_outputs"
    assert "Invalid structured_outputs structural_tag specification" in str(error)


# ------------------------------------------------------------------------------ preparation


async def test_a_resumed_input_spends_its_tokens_from_vllms_params(engine):
    resume = [9, 10, 11]
    item = GenerateInput(token_ids=[5, 6, 7], resume_token_ids=resume)
    result = await prepared(engine, build_request("r", [item], SamplingParams(max_tokens=10, min_tokens=5)))
    assert (result.engine_params.max_tokens, result.engine_params.min_tokens) == (7, 2)
    assert result.prompt_token_ids == [5, 6, 7] + resume and result.prompt_len == 3
    assert not result.exhausted


@pytest.mark.parametrize("body", [{"chat_template": "{{ 'x' }}"}, {"chat_template_kwargs": {"chat_template": "x"}}])
async def test_a_request_may_not_bring_its_own_chat_template(engine, body):
    """As vllm serve without --trust-request-chat-template; refused before anything is rendered."""
    request = build_request("r", [GenerateInput(messages=USER)], extra_body=body)
    error = await prepare_refusal(engine, request)
    assert error.param == "chat_template"
    assert "the model's is used" in str(error)


async def test_the_envelopes_n_frames_the_request_as_the_router_resumes_one_sample(engine):
    """Migration of an n=3 request resumes each sample alone: the envelope says n=1, the body is untouched."""
    original = build_request("r", [GenerateInput(token_ids=[5, 6, 7])], SamplingParams(n=3, max_tokens=4))
    assert (await prepared(engine, original)).engine_params.n == 3
    one_sample = dataclasses.replace(original, n=1, inputs=[GenerateInput(token_ids=[5, 6, 7], resume_token_ids=[8])])
    result = await prepared(engine, one_sample)
    assert one_sample.body == original.body
    assert (result.engine_params.n, result.engine_params.max_tokens) == (1, 3)
    assert result.prompt_token_ids == [5, 6, 7, 8]
