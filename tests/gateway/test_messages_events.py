"""Anthropic's events and stop reasons from the fleet's chunks (pure: gateway/anthropic/events.py,
answer.py). The SDK tests show clients read them; these pin the orderings a small model rarely makes."""

from __future__ import annotations

import json

import pytest

from vllm_fleet.gateway.anthropic.answer import WholeMessage, stop_reason
from vllm_fleet.gateway.anthropic.events import AnthropicEvents
from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.protocol.types import Chunk, ToolCallDelta, Usage


def chunk(text="", *, reasoning="", calls=None, finish=None, stop=None, usage=None) -> Chunk:
    return Chunk(index=0, sample=0, text=text, token_ids=[1], reasoning=reasoning, tool_calls=calls,
                 finish_reason=finish, stop_reason=stop, usage=usage)


def parse(raw: bytes) -> list[tuple[str, dict]]:
    events = []
    for record in raw.decode().split("\n\n"):
        if record:
            name, data = record.split("\n")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_thinking_text_and_a_tool_call_become_blocks_in_order_with_held_text_after_the_call():
    events = AnthropicEvents("msg_1", "m", ())
    raw = events.start()
    raw += events.event(chunk(reasoning="hmm"))
    raw += events.event(chunk("Let me look."))
    raw += events.event(chunk(calls=[ToolCallDelta(0, id="call_1", name="f", arguments='{"a":')]))
    raw += events.event(chunk("stray", calls=[ToolCallDelta(0, arguments=" 1}")]))
    raw += events.event(chunk(finish="tool_calls", usage=Usage(prompt_tokens=9, completion_tokens=6, cached_tokens=4)))
    raw += events.end()
    got = parse(raw)
    shape = [(n, d.get("index"), (d.get("content_block") or d.get("delta") or {}).get("type")) for n, d in got]
    assert shape == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
        ("content_block_start", 3, "text"), ("content_block_delta", 3, "text_delta"), ("content_block_stop", 3, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert got[8][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    assert got[13][1]["delta"]["text"] == "stray"
    final = got[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"] == {"input_tokens": 5, "output_tokens": 6, "cache_read_input_tokens": 4}


def test_an_error_is_anthropics_event():
    (name, data), = parse(AnthropicEvents.error(ApiError(503, "no worker")))
    assert name == "error" and data == {"type": "error", "error": {"type": "overloaded_error", "message": "no worker"}}


@pytest.mark.parametrize("finish, matched, stops, used, complete, want", [
    ("length", None, (), False, False, ("max_tokens", None)),
    ("stop", "END", ("END",), False, False, ("stop_sequence", "END")),
    ("stop", "2", ("END",), False, False, ("end_turn", None)),  # a stop token id, not a stop string
    ("stop", None, (), True, True, ("tool_use", None)),          # a named tool call stays "stop" in vLLM
    ("stop", "END", ("END",), True, False, ("stop_sequence", "END")),  # a call cut short must not run
    ("stop", None, (), False, False, ("end_turn", None)),
])
def test_stop_reasons_follow_vllms_rule(finish, matched, stops, used, complete, want):
    assert stop_reason(finish, matched, stops, tool_used=used, tool_complete=complete) == want


def test_a_whole_message_parses_tool_input_and_refuses_arguments_that_are_not_json():
    message = WholeMessage("msg_2", "m", ())
    message.add(chunk(calls=[ToolCallDelta(0, id="c", name="f", arguments='{"city": "Paris"}')]))
    message.add(chunk(finish="stop", usage=Usage(prompt_tokens=3, completion_tokens=5)))
    body = message.body()
    assert body["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {"city": "Paris"}}]
    assert body["stop_reason"] == "tool_use" and body["usage"] == {"input_tokens": 3, "output_tokens": 5}
    cut = WholeMessage("msg_3", "m", ())
    cut.add(chunk(calls=[ToolCallDelta(0, id="c", name="f", arguments='{"city": "Pa')], finish="length"))
    with pytest.raises(ApiError, match="not JSON"):
        cut.body()
