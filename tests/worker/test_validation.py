"""Worker validation as a unit: each rule refuses with InvalidRequestError naming its field."""

import pytest

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.worker.validation import Limits, check_prompt_fits, validate_request

LIMITS = Limits(max_n=4, max_inputs=3, max_logprobs=5)


def request(*inputs: GenerateInput, **params) -> GenerateRequest:
    return GenerateRequest("r", list(inputs) or [GenerateInput(text="hello")], SamplingParams(**params))


TEXT = GenerateInput(text="hello")

# (request, the field it must name as `param`, words of the message that name what to change)
REFUSED = [
    (GenerateRequest("r", []), "inputs", "no inputs"),
    (request(TEXT, TEXT, TEXT, TEXT), "inputs", "at most 3"),
    (request(GenerateInput(messages=[])), "messages", "messages is empty"),
    (request(GenerateInput(messages=[ChatMessage("user", "a"), ChatMessage("robot", "b")])), "messages",
     "message 1 has unknown role 'robot'"),
    (request(GenerateInput(token_ids=[])), "prompt", "token_ids is empty"),
    (request(GenerateInput(text="")), "prompt", "prompt is empty"),
    (request(GenerateInput(token_ids=[1], resume_token_ids=[2]), n=2), "n", "resume_token_ids needs n=1"),
    (request(max_tokens=0), "max_tokens", "max_tokens must be at least 1"),
    (request(min_tokens=-1), "min_tokens", "min_tokens must be 0 or more"),
    (request(min_tokens=5, max_tokens=4), "min_tokens", "min_tokens (5) is larger than max_tokens (4)"),
    (request(n=0), "n", "n must be between 1 and 4"),
    (request(n=5), "n", "n must be between 1 and 4"),
    (request(temperature=2.5), "temperature", "temperature must be between 0 and 2"),
    (request(top_p=0), "top_p", "top_p must be in (0, 1]"),
    (request(top_k=-2), "top_k", "top_k must be -1"),
    (request(logprobs=6), "logprobs", "logprobs must be between 0 and 5"),
    (request(presence_penalty=2.1), "presence_penalty", "presence_penalty must be between -2 and 2"),
    (request(frequency_penalty=-3), "frequency_penalty", "frequency_penalty must be between -2 and 2"),
    (request(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be in (0, 2]"),
    (request(stop=["ok", ""]), "stop", "stop strings must not be empty"),
]


@pytest.mark.parametrize("bad, param, words", REFUSED, ids=[f"{p}:{w}" for _, p, w in REFUSED])
def test_each_rule_refuses_naming_the_field(bad, param, words):
    with pytest.raises(InvalidRequestError) as refused:
        validate_request(bad, LIMITS)
    assert refused.value.param == param
    assert words in str(refused.value)
    assert not refused.value.recoverable  # resending the same request cannot help


def test_the_edges_of_every_range_are_accepted():
    for params in [dict(temperature=0), dict(temperature=2), dict(top_p=1), dict(top_k=-1), dict(top_k=0),
                   dict(n=1), dict(n=4), dict(logprobs=0), dict(logprobs=5), dict(min_tokens=4, max_tokens=4),
                   dict(presence_penalty=-2), dict(frequency_penalty=2), dict(repetition_penalty=2)]:
        validate_request(request(**params), LIMITS)
    validate_request(request(GenerateInput(token_ids=[1], resume_token_ids=[2])), LIMITS)
    validate_request(request(TEXT, GenerateInput(messages=[ChatMessage("system", "s"), ChatMessage("user", "u")]),
                             GenerateInput(token_ids=[3])), LIMITS)


def test_the_failing_input_is_named_by_its_index():
    with pytest.raises(InvalidRequestError, match="input 1: the prompt is empty"):
        validate_request(request(TEXT, GenerateInput(text="")), LIMITS)


def test_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(InvalidRequestError, match="token id 100 is outside the model's vocabulary of 100") as refused:
        check_prompt_fits(2, 3, 0, None, 50, 100, [1, 100, 2])
    assert refused.value.param == "prompt" and "input 2" in str(refused.value)
    check_prompt_fits(2, 3, 0, None, 50, 100, [1, 99, 2])
    check_prompt_fits(2, 3, 0, None, 50, None, [1, 10_000, 2])  # no vocabulary known: not checked


def test_a_prompt_that_leaves_no_room_for_an_answer_is_refused():
    with pytest.raises(InvalidRequestError, match="context is 50 tokens.*shorten the prompt") as refused:
        check_prompt_fits(0, 45, 5, None, 50, None, [])  # resumed tokens count as prompt
    assert refused.value.param == "prompt"
    check_prompt_fits(0, 45, 4, None, 50, None, [])


def test_max_tokens_beyond_the_context_is_refused_with_the_largest_that_fits():
    with pytest.raises(InvalidRequestError, match="lower max_tokens to at most 10") as refused:
        check_prompt_fits(0, 40, 0, 11, 50, None, [])
    assert refused.value.param == "max_tokens"
    check_prompt_fits(0, 40, 0, 10, 50, None, [])

