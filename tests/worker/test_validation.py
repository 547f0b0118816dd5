"""The worker's own rules as a unit: the envelope's shape and this worker's bounds.

Each rule refuses with InvalidRequestError naming its field. What a body field's values may be
is vLLM's rule, not restated here (tests/worker/test_openai_request.py checks that vLLM's
refusal comes back naming the field).
"""

import pytest

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, GenerateRequest
from vllm_fleet.worker.validation import Limits, check_logprobs, check_prompt_fits, validate_request

LIMITS = Limits(max_n=4, max_inputs=3, max_logprobs=5)
TEXT = GenerateInput(text="hello")


def request(*inputs: GenerateInput, priority: int = 0, **params) -> GenerateRequest:
    return build_request("r", list(inputs) or [TEXT], SamplingParams(**params), priority=priority)


def validate(request_: GenerateRequest, *, schedules_by_priority: bool = False) -> None:
    validate_request(request_, LIMITS, schedules_by_priority=schedules_by_priority)


# (request, the field it must name as `param`, words of the message that name what to change)
REFUSED = [
    (build_request("r", []), "inputs", "no inputs; send at least one prompt"),
    (request(TEXT, TEXT, TEXT, TEXT), "inputs", "takes at most 3 per request"),
    (request(GenerateInput(messages=[])), "messages", "messages is empty; send at least one message"),
    (request(GenerateInput(token_ids=[])), "prompt", "token_ids is empty"),
    (request(GenerateInput(text="")), "prompt", "the prompt is empty"),
    (request(GenerateInput(token_ids=[1], resume_token_ids=[2]), n=2), "n",
     "resume_token_ids needs n=1 (resume each sample on its own)"),
    (request(n=0), "n", "n must be between 1 and 4 (got 0)"),
    (request(n=5), "n", "n must be between 1 and 4 (got 5)"),
    (request(priority=3), "priority", "send priority 0 here"),
]


@pytest.mark.parametrize("bad, param, words", REFUSED, ids=[f"{p}:{w}" for _, p, w in REFUSED])
def test_each_rule_refuses_naming_the_field(bad, param, words):
    with pytest.raises(InvalidRequestError) as refused:
        validate(bad)
    assert refused.value.param == param
    assert words in str(refused.value)
    assert not refused.value.recoverable  # resending the same request cannot help


def test_the_edges_of_every_bound_are_accepted():
    for ok in [request(n=1), request(n=4), request(TEXT, TEXT, TEXT),
               request(GenerateInput(token_ids=[1], resume_token_ids=[2])),
               request(GenerateInput(messages=[ChatMessage("system", "s"), ChatMessage("user", "u")]),
                       GenerateInput(messages=[{"role": "user", "content": "u"}])),
               request(TEXT, GenerateInput(token_ids=[3]))]:
        validate(ok)
    validate(request(priority=3), schedules_by_priority=True)
    validate(request(priority=-2), schedules_by_priority=True)


def test_values_of_body_fields_and_chat_roles_are_left_to_vllm():
    """Deliberately not the worker's rules: vLLM's request model judges values, and vLLM passes
    any role to the chat template (the gateway's schema refuses unknown roles over HTTP)."""
    validate(request(temperature=3.0, max_tokens=0, top_p=0, min_tokens=5, stop=[""]))
    validate(request(GenerateInput(messages=[ChatMessage("robot", "beep")])))


def test_the_failing_input_is_named_by_its_index():
    with pytest.raises(InvalidRequestError, match="input 1: the prompt is empty"):
        validate(request(TEXT, GenerateInput(text="")))


def test_logprobs_beyond_the_workers_bound_are_refused_naming_logprobs():
    for ok in (None, 0, 5):
        check_logprobs(ok, 5)
    for bad in (6, -1):
        with pytest.raises(InvalidRequestError, match=f"logprobs must be between 0 and 5 \\(got {bad}\\)") as refused:
            check_logprobs(bad, 5)
        assert refused.value.param == "logprobs"


def test_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(InvalidRequestError, match="token id 100 is outside the model's vocabulary of 100") as refused:
        check_prompt_fits(2, 3, 0, 50, 100, [1, 100, 2])
    assert refused.value.param == "prompt" and "input 2" in str(refused.value)
    check_prompt_fits(2, 3, 0, 50, 100, [1, 99, 2])
    check_prompt_fits(2, 3, 0, 50, None, [1, 10_000, 2])  # no vocabulary known: not checked


def test_a_prompt_that_leaves_no_room_for_an_answer_is_refused():
    with pytest.raises(InvalidRequestError, match="context is 50 tokens.*shorten the prompt") as refused:
        check_prompt_fits(0, 45, 5, 50, None, [])  # resumed tokens count as prompt
    assert refused.value.param == "prompt"
    check_prompt_fits(0, 45, 4, 50, None, [])

