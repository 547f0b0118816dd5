"""Anthropic's streaming events from the fleet's chunks, in vLLM's order and shapes.

    message_start                      (usage so far: output 0; the prompt's count comes at the end)
    content_block_start  index i       text | thinking | tool_use (id, name, input {})
    content_block_delta  index i       text_delta | thinking_delta | input_json_delta
    content_block_stop   index i       (a thinking block gets its signature_delta first)
    ... one block at a time, indices from 0 ...
    message_delta                      stop_reason, stop_sequence; usage (input and output tokens)
    message_stop

A worker chunk may carry reasoning, text and tool-call pieces at once; they become blocks in that
order. Text that arrives while a tool_use block is open is held and sent as a text block after it,
as vLLM does. An error after the first event becomes an `error` event, and the stream ends.
vLLM's stream has no `ping` events, so neither has ours. Each event is one SSE record,
`event: <type>` then `data: <json>`.
"""

from __future__ import annotations

import json
import uuid

from vllm_fleet.gateway.anthropic.answer import is_json, stop_reason, usage_body
from vllm_fleet.gateway.anthropic.errors import anthropic_body
from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.formats import UsageTally
from vllm_fleet.protocol.types import Chunk, ToolCallDelta

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {_dumps(data)}\n\n".encode()


class AnthropicEvents:
    """Turns the chunks of one Messages request into SSE bytes (front_door.StreamWriter). One instance per request."""

    def __init__(self, response_id: str, model: str, stop_sequences: tuple[str, ...]) -> None:
        self.response_id = response_id
        self.model = model
        self.stop_sequences = stop_sequences
        self.usage = UsageTally()
        self._next_index = 0
        self._open: str | None = None          # the open block's type
        self._tool_id: str | None = None       # the open tool_use block's call id
        self._ids: dict[int, str] = {}         # tool call index → id
        self._held_text: list[str] = []        # text that came while a tool_use block was open
        self._tool_used = False
        self._last_arguments: list[str] = []
        self._finish: tuple[str | None, str | None] = (None, None)

    def start(self) -> bytes:
        message = {"id": self.response_id, "type": "message", "role": "assistant", "content": [],
                   "model": self.model, "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return sse("message_start", {"type": "message_start", "message": message})

    def event(self, chunk: Chunk) -> bytes:
        self.usage.add(chunk)
        out: list[bytes] = []
        if chunk.finish_reason is not None:
            self._finish = (chunk.finish_reason, chunk.stop_reason)
        if chunk.reasoning:
            if self._open != "thinking":
                out += self._close_and_flush()
                out.append(self._start_block({"type": "thinking", "thinking": ""}))
            out.append(self._delta({"type": "thinking_delta", "thinking": chunk.reasoning}))
        if chunk.text:
            if self._open == "tool_use":
                self._held_text.append(chunk.text)
            else:
                if self._open != "text":
                    out += self._close_and_flush()
                    out.append(self._start_block({"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for call in chunk.tool_calls or ():
            out += self._tool_piece(call)
        return b"".join(out)

    def _tool_piece(self, call: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if call.id:
            self._ids[call.index] = call.id
            if call.id != self._tool_id and call.name:
                out += self._close_and_flush()
                self._tool_used = True
                self._last_arguments = []
                out.append(self._start_block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
                self._tool_id = call.id
        if call.arguments and self._ids.get(call.index) == self._tool_id and self._open == "tool_use":
            self._last_arguments.append(call.arguments)
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out

    def end(self) -> bytes:
        """The open block's end, message_delta with the stop reason and usage, message_stop."""
        out = self._close_and_flush()
        finish, matched = self._finish
        reason, sequence = stop_reason(finish or "stop", matched, self.stop_sequences, tool_used=self._tool_used,
                                       tool_complete=self._tool_used and is_json("".join(self._last_arguments)))
        out.append(sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": usage_body(self.usage)}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    @staticmethod
    def error(error: ApiError) -> bytes:
        return sse("error", anthropic_body(error))

    # -- blocks -----------------------------------------------------------------------------

    def _start_block(self, block: dict) -> bytes:
        self._open = block["type"]
        return sse("content_block_start", {"type": "content_block_start", "index": self._next_index,
                                           "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self._next_index, "delta": delta})

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": uuid.uuid4().hex}))
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self._next_index}))
        self._open, self._tool_id = None, None
        self._next_index += 1
        return out

    def _close_and_flush(self) -> list[bytes]:
        """Close the open block; text held during a tool_use block follows as its own block."""
        out = self._close()
        if self._held_text:
            text, self._held_text = "".join(self._held_text), []
            out.append(self._start_block({"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": text}))
            out += self._close()
        return out
