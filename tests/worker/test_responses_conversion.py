"""A Responses body as the chat request the worker runs: vLLM's conversion of the input items, and
the fields mapped to their chat names (worker/openai/responses.py). No engine needed."""

from __future__ import annotations

import pytest

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.worker.openai.responses import chat_fields

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def test_items_become_vllms_chat_messages_and_fields_keep_their_meaning():
    fields = chat_fields({
        "instructions": "be brief", "max_output_tokens": 9, "temperature": 0, "n": 1,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}})
    assert fields["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    assert fields["max_completion_tokens"] == 9 and fields["temperature"] == 0
    assert fields["tools"] == [{"type": "function", "function": {"name": "get_weather",
                                                                  "parameters": {"type": "object", "properties": {}}}}]
    assert fields["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert fields["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}


def test_a_string_input_is_one_user_message():
    assert chat_fields({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


def test_built_in_tools_are_refused_by_name():
    with pytest.raises(InvalidRequestError) as info:
        chat_fields({"input": "hi", "tools": [{"type": "web_search"}]})
    assert info.value.param == "tools"
