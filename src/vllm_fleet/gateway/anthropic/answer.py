"""Anthropic's answer pieces from the fleet's chunks: stop reason, usage, and the whole message.

The rules are vLLM's (vllm/entrypoints/anthropic/serving.py), restated here because the gateway
does not import vLLM:
- stop_reason: "max_tokens" when the length ran out; a complete tool call → "tool_use"; a
  matched stop string → "stop_sequence" (with `stop_sequence` set); a tool call cut short by a
  stop string → "stop_sequence" too (it must not run); else "end_turn".
- usage: input_tokens are the prompt's tokens less those read from the prefix cache, which are
  reported as cache_read_input_tokens (when any were).
- content: a thinking block (the reasoning parser's text), a text block, then one tool_use block
  per call with its arguments parsed as JSON; an empty answer is one empty text block.
"""

from __future__ import annotations

import json
import uuid

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.formats import ToolCalls, UsageTally
from vllm_fleet.protocol.types import Chunk


def stop_reason(finish_reason: str | None, matched: str | None, stop_sequences: tuple[str, ...],
                tool_used: bool, tool_complete: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence). `matched` is the chunk's stop_reason: a stop string, or a stop
    token id as text, told apart by the request's own stop_sequences."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if matched is not None and matched in stop_sequences:
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def usage_body(usage: UsageTally) -> dict:
    cached = usage.cached
    body = {"input_tokens": max(0, usage.prompt - cached), "output_tokens": usage.completion}
    if cached:
        body["cache_read_input_tokens"] = cached
    return body


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def message_id(request_id: str) -> str:
    return "msg_" + request_id


class WholeMessage:
    """Collects one sample's chunks; `body()` is Anthropic's message object."""

    def __init__(self, response_id: str, model: str, stop_sequences: tuple[str, ...]) -> None:
        self.response_id = response_id
        self.model = model
        self.stop_sequences = stop_sequences
        self.usage = UsageTally()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls = ToolCalls()
        self._finish: tuple[str | None, str | None] = (None, None)

    def add(self, chunk: Chunk) -> None:
        self.usage.add(chunk)
        if chunk.text:
            self._text.append(chunk.text)
        if chunk.reasoning:
            self._reasoning.append(chunk.reasoning)
        if chunk.tool_calls:
            self._calls.add(chunk.tool_calls)
        if chunk.finish_reason is not None:
            self._finish = (chunk.finish_reason, chunk.stop_reason)

    def body(self) -> dict:
        calls = self._calls.body() if self._calls else []
        content: list[dict] = []
        if self._reasoning:
            content.append({"type": "thinking", "thinking": "".join(self._reasoning), "signature": uuid.uuid4().hex})
        if self._text:
            content.append({"type": "text", "text": "".join(self._text)})
        for call in calls:
            arguments = call["function"]["arguments"]
            try:
                parsed = json.loads(arguments or "{}")
            except ValueError:
                raise ApiError(502, f"the model's call of tool {call['function']['name']!r} has arguments that "
                               f"are not JSON ({arguments[:80]!r}); raise max_tokens or force the tool with "
                               "tool_choice", type="upstream_error", code="tool_arguments_not_json") from None
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": parsed})
        reason, sequence = stop_reason(*self._finish, self.stop_sequences, tool_used=bool(calls),
                                       tool_complete=bool(calls))
        return {"id": self.response_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content or [{"type": "text", "text": ""}], "stop_reason": reason,
                "stop_sequence": sequence, "usage": usage_body(self.usage)}
