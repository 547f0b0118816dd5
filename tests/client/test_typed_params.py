"""The Python client's typed parameters build the request body; a shape they cannot build is
refused before anything is sent, saying what to change. (Values are vLLM's to judge, on the worker.)"""

from __future__ import annotations

import json

import pytest

from vllm_fleet.protocol import ChatMessage, Constraint, GenerateInput, SamplingParams, build_request


@pytest.mark.parametrize("constraint, words", [
    (Constraint(), "constraint must set exactly one of json_schema, json_object, regex, choice, grammar, "
                   "structural_tag (it sets none)"),
    (Constraint(regex="a", grammar="b"), "(it sets regex, grammar)"),
    (Constraint(json_schema="{no"), "constraint.json_schema is not JSON"),
    (Constraint(structural_tag="nope"), "constraint.structural_tag is not JSON"),
    (Constraint(choice=[]), "constraint.choice is empty"),
])
def test_a_constraint_that_is_not_one_valid_kind_is_refused_naming_it(constraint, words):
    with pytest.raises(ValueError) as refused:
        build_request("r", [GenerateInput(text="x")], SamplingParams(constraint=constraint))
    assert words in str(refused.value)


def test_one_request_is_chat_or_prompts_never_both():
    with pytest.raises(ValueError, match="all chat messages or all prompts"):
        build_request("r", [GenerateInput(text="x"), GenerateInput(messages=[ChatMessage("user", "hi")])])
    chat = build_request("r", [GenerateInput(messages=[ChatMessage("user", "hi")])])
    prompts = build_request("r", [GenerateInput(text="x"), GenerateInput(token_ids=[1, 2])])
    assert (chat.body.endpoint, prompts.body.endpoint) == ("chat", "completion")


def test_n_and_priority_travel_in_the_envelope_not_the_body():
    request = build_request("r", [GenerateInput(text="x")], SamplingParams(n=3, max_tokens=5), priority=2)
    assert (request.n, request.priority) == (3, 2)
    assert json.loads(request.body.body_json) == {"max_tokens": 5}
