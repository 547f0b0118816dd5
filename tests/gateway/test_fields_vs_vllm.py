"""fields.py against vLLM's own request models, read at run time.

A vLLM upgrade that adds a request field fails here until the field is classified in
gateway/fields.py (forwarded, handled by the gateway, inert, or refused on purpose).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_fleet.gateway import fields
from vllm_fleet.gateway.fields import Kind
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest


def _vllm_models():
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VChat
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VCompletion
    except ImportError as exc:
        pytest.skip(f"vLLM's OpenAI request models are not importable here ({exc}); "
                    "the comparison runs wherever vLLM is installed")
    return {"chat": VChat, "completion": VCompletion}


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_every_vllm_field_is_classified(endpoint):
    vllm_fields = set(_vllm_models()[endpoint].model_fields)
    missing = sorted(vllm_fields - set(fields.TABLES[endpoint]))
    assert not missing, f"vLLM's {endpoint} request has fields gateway/fields.py does not classify: {missing}"


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_every_classified_field_is_vllms_or_marked_openai_only(endpoint):
    vllm_fields = set(_vllm_models()[endpoint].model_fields)
    table = fields.TABLES[endpoint]
    strays = sorted(name for name, rule in table.items() if name not in vllm_fields and not rule.openai_only)
    assert not strays, f"fields.py lists {strays} for {endpoint}, which vLLM does not know and are not openai_only"
    wrongly_marked = sorted(name for name, rule in table.items() if rule.openai_only and name in vllm_fields)
    assert not wrongly_marked, f"{wrongly_marked} are vLLM fields now: classify them by vLLM's meaning"


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_every_openai_sdk_parameter_is_classified(endpoint):
    """The installed openai client's create() parameters: what OpenAI clients may send."""
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params

    params = (chat_create_params if endpoint == "chat" else completion_create_params).CompletionCreateParamsBase
    missing = sorted(set(params.__annotations__) - set(fields.TABLES[endpoint]))
    assert not missing, f"the openai client sends {missing} to {endpoint}, which gateway/fields.py does not classify"


@pytest.mark.parametrize("endpoint, schema", [("chat", ChatCompletionRequest), ("completion", CompletionRequest)])
def test_gateway_fields_are_modelled_and_modelled_fields_classified(endpoint, schema):
    """A GATEWAY field the schema did not model would land among the extras and be dropped. A
    modelled field is the gateway's, forwarded in the body (ENGINE) or carried by the envelope."""
    table = fields.TABLES[endpoint]
    gateway = {name for name, rule in table.items() if rule.kind is Kind.GATEWAY}
    assert gateway <= set(schema.model_fields)
    assert set(schema.model_fields) <= set(table)
    assert all(rule.kind in (Kind.GATEWAY, Kind.ENGINE, Kind.ENVELOPE)
               for name, rule in table.items() if name in schema.model_fields)


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_envelope_fields_are_what_the_worker_takes_from_the_envelope(endpoint):
    """n and priority are vLLM's fields that the fleet schedules: the gateway keeps them out of the
    body, and the worker refuses a body that carries them."""
    from vllm_fleet.worker.openai.request import ENVELOPE_FIELDS

    table = fields.TABLES[endpoint]
    envelope = {name for name, rule in table.items() if rule.kind is Kind.ENVELOPE}
    assert envelope == {"n", "priority"}
    assert envelope <= set(ENVELOPE_FIELDS)
    assert not envelope & fields.engine_fields(endpoint)


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_the_issue_s_fields_are_honoured(endpoint):
    """The fields issue #14 names: none of them may be refused."""
    named = {"ignore_eos", "min_tokens", "top_k", "min_p", "repetition_penalty", "logit_bias", "stop_token_ids",
             "include_stop_str_in_output", "skip_special_tokens", "bad_words", "allowed_token_ids",
             "truncate_prompt_tokens", "echo", "stream_options", "user", "metadata", "response_format",
             "structured_outputs"}
    if endpoint == "chat":
        named |= {"chat_template_kwargs", "add_generation_prompt", "continue_final_message", "parallel_tool_calls",
                  "tools", "tool_choice"}
    table = fields.TABLES[endpoint]
    assert all(table[name].kind is not Kind.REFUSED for name in named)


def test_docs_show_the_tables():
    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    for endpoint in ("chat", "completion"):
        assert fields.table_markdown(endpoint) in doc, (
            f"docs/gateway.md's {endpoint} table differs from fields.py; paste fields.table_markdown({endpoint!r})")


def test_refusals_say_why():
    for table in fields.TABLES.values():
        for name, rule in table.items():
            assert rule.why and not re.search(r"\|", rule.why), name  # shown in a Markdown table
