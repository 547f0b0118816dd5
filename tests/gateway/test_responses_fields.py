"""The /v1/responses field table against vLLM's ResponsesRequest: a vLLM upgrade that adds a field
fails here until the field is classified (served with vLLM's meaning, or refused by name)."""

from __future__ import annotations

from vllm_fleet.gateway.fields import Kind
from vllm_fleet.gateway.responses_fields import RESPONSES


def _vllm_fields() -> set[str]:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return set(ResponsesRequest.model_fields)


def test_every_vllm_field_is_classified():
    missing = sorted(_vllm_fields() - set(RESPONSES))
    assert not missing, f"vLLM's ResponsesRequest has fields gateway/responses_fields.py does not classify: {missing}"


def test_every_classified_field_is_vllms_or_marked_openai_only():
    strays = sorted(name for name, rule in RESPONSES.items() if name not in _vllm_fields() and not rule.openai_only)
    assert not strays, f"responses_fields.py lists {strays}, which vLLM does not know and are not openai_only"


def test_engine_fields_are_the_ones_the_worker_converts():
    from vllm_fleet.worker.openai.responses import _SAME_FIELDS

    converted = set(_SAME_FIELDS) | {"instructions", "max_output_tokens", "text", "tools", "tool_choice", "reasoning"}
    engine = {name for name, rule in RESPONSES.items() if rule.kind is Kind.ENGINE}
    assert engine <= converted, f"ENGINE fields the worker's conversion drops: {sorted(engine - converted)}"
