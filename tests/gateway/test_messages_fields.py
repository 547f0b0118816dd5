"""The Messages field table (gateway/anthropic/request.py) against vLLM's AnthropicMessagesRequest,
at run time: a vLLM upgrade that adds a field fails here until the field is classified."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.gateway.anthropic import request
from vllm_fleet.gateway.fields import Kind


def test_every_field_of_vllms_messages_request_is_classified():
    protocol = pytest.importorskip("vllm.entrypoints.anthropic.protocol")
    vllm_fields = set(protocol.AnthropicMessagesRequest.model_fields)
    assert vllm_fields - set(request.FIELDS) == set(), "classify these in gateway/anthropic/request.py FIELDS"


def test_engine_fields_are_fields_vllm_reads():
    """What the gateway forwards, vLLM's model must read (else pydantic would drop it silently there)."""
    protocol = pytest.importorskip("vllm.entrypoints.anthropic.protocol")
    engine = {name for name, rule in request.FIELDS.items() if rule.kind is Kind.ENGINE}
    assert engine <= set(protocol.AnthropicMessagesRequest.model_fields)


def test_docs_show_the_table():
    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    assert request.table_markdown() in doc, "paste vllm_fleet.gateway.anthropic.request.table_markdown() into docs"
