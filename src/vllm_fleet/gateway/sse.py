"""Server-sent events in OpenAI's streaming format, built without re-parsing anything.

Each event is a preformatted prefix (id, object, created, model: fixed for the request) plus
the JSON of one small choice dict, encoded by orjson (a tenth of json.dumps' cost; identical bytes
for the strings, ints, bools and nulls of an event). Events with logprobs keep json's encoder: its
float spelling (1e-05, -Infinity) is what clients saw before. A worker chunk may carry several coalesced tokens; it
becomes one event, whose delta has the chunk's content, `reasoning` (the key vLLM 0.32 sends)
and `tool_calls` pieces. The stream ends with an optional usage event and `data: [DONE]`; an error
after the first byte becomes an error event, then `[DONE]`.
"""

from __future__ import annotations

import json

import orjson

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.formats import DONE, CompletionLogprobs, UsageTally, chat_logprobs, tool_call_deltas
from vllm_fleet.gateway.translate import Plan
from vllm_fleet.protocol.types import Chunk

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class StreamEncoder:
    """Turns the chunks of one request into SSE bytes (front_door.StreamWriter). One instance per request."""

    def __init__(self, plan: Plan, response_id: str, created: int) -> None:
        self.plan = plan
        self.usage = UsageTally()
        self.chat = plan.kind == "chat"
        head = {"id": response_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": created, "model": plan.model}
        # '{"id":...,"model":"m"' — the rest of each event is appended to this fixed head.
        self._head = "data: " + _dumps(head)[:-1] + ',"choices":['
        self._tail = ',"usage":null}\n\n' if plan.include_usage else "}\n\n"
        self._head_bytes = self._head.encode()
        self._tail_bytes = b"]" + self._tail.encode()
        self._started: set[int] = set()
        self._completion_logprobs: dict[int, CompletionLogprobs] = {}
        # The template of a text-only event (`event`): not with continuous usage (usage on every
        # event) or echo-only completions (no text shown); logprobs are checked per chunk.
        self._plain = not plan.continuous_usage and not (not self.chat and plan.echo_only)
        self._plain_heads: dict[int, bytes] = {}
        self._plain_tail = (b"}" if self.chat else b"") + b',"logprobs":null,"finish_reason":null}' + self._tail_bytes

    def event(self, chunk: Chunk) -> bytes:
        self.usage.add(chunk)
        choice = chunk.index * self.plan.n + chunk.sample
        if (chunk.text and chunk.finish_reason is None and chunk.logprobs is None and not chunk.reasoning
                and chunk.tool_calls is None and self._plain and choice in self._started):
            # Almost every event of a stream: a piece of text. Bytes from a template, the same
            # as the dict's encoding below (orjson; it costs a third of building the dict).
            return self._plain_head(choice) + orjson.dumps(chunk.text) + self._plain_tail
        first = choice not in self._started
        self._started.add(choice)
        if self.chat:
            body = self._chat_choice(choice, chunk, first)
        else:
            body = self._completion_choice(choice, chunk, first)
        if self.plan.continuous_usage:
            # vLLM's continuous_usage_stats: this choice's usage so far on every event.
            usage = _dumps(self.usage.body_of(chunk.index, chunk.sample))
            return (self._head + _dumps(body) + '],"usage":' + usage + "}\n\n").encode()
        if body["logprobs"] is not None:
            return (self._head + _dumps(body) + "]" + self._tail).encode()
        return self._head_bytes + orjson.dumps(body) + self._tail_bytes

    def _plain_head(self, choice: int) -> bytes:
        head = self._plain_heads.get(choice)
        if head is None:
            field = b'"delta":{"content":' if self.chat else b'"text":'
            head = self._plain_heads[choice] = self._head_bytes + b'{"index":%d,' % choice + field
        return head

    def _chat_choice(self, choice: int, chunk: Chunk, first: bool) -> dict:
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
            delta["content"] = self.plan.echo_prefix + chunk.text
        elif chunk.text:
            delta["content"] = chunk.text
        if chunk.reasoning:
            delta["reasoning"] = chunk.reasoning
        if chunk.tool_calls:
            delta["tool_calls"] = tool_call_deltas(chunk.tool_calls)
        body = {"index": choice, "delta": delta, "logprobs": None, "finish_reason": chunk.finish_reason}
        if chunk.logprobs is not None:
            body["logprobs"] = {"content": chat_logprobs(chunk.logprobs)}
        return body

    def _completion_choice(self, choice: int, chunk: Chunk, first: bool) -> dict:
        # echo with max_tokens 0: the prompt alone (the engine's one token is not shown), as vLLM does.
        text, logprobs = ("", None) if self.plan.echo_only else (chunk.text, chunk.logprobs)
        prompt = None
        if first and self.plan.echo:
            text = (chunk.prompt_text or "") + text
            prompt = chunk.prompt_logprobs  # the prompt's tokens start the first event's logprobs
        body = {"index": choice, "text": text, "logprobs": None, "finish_reason": chunk.finish_reason}
        if self.plan.logprobs is not None and (logprobs is not None or prompt is not None):
            tracker = self._completion_logprobs.setdefault(choice, CompletionLogprobs())
            body["logprobs"] = tracker.body(logprobs or [], prompt, self.plan.logprobs)
        return body

    @staticmethod
    def start() -> bytes:
        """OpenAI's stream has nothing before its first chunk's event."""
        return b""

    def end(self) -> bytes:
        """The usage event (if asked for) and [DONE]."""
        if not self.plan.include_usage:
            return DONE
        usage = self._head + '],"usage":' + _dumps(self.usage.body()) + "}\n\n"
        return usage.encode() + DONE

    @staticmethod
    def error(error: ApiError) -> bytes:
        return b"data: " + error.body_bytes() + b"\n\n" + DONE

