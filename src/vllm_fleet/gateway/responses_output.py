"""The Responses answer built from the fleet's chunks: output items, the streaming events, the final object.

One state machine serves both forms: every chunk (content, reasoning, tool-call pieces, already
parsed on the worker by vLLM's parsers) opens, extends or closes output items and yields the
events vLLM 0.32's server streams for them (its SimpleStreamingEventProcessor):

    response.created, response.in_progress,
    per message:  output_item.added, content_part.added, output_text.delta..., output_text.done,
                  content_part.done, output_item.done
    per reasoning: the same with reasoning_text.delta / reasoning_text.done
    per function call: output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                  output_item.done
    response.completed (status "incomplete", incomplete_details {reason: max_output_tokens} when the
    answer hit its length; vLLM sends response.completed then too)

each with an increasing `sequence_number`. A whole answer is the final object the same events
would have ended with. ResponsesOutput is both of the front door's forms (front_door.py): a
StreamWriter (`start`, `event`, `end`, `error`: SSE bytes) and a WholeAnswer (`add`, `body`).
"""

from __future__ import annotations

import secrets
import time

import orjson

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.protocol.types import Chunk, ToolCallDelta


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _sse(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _joined(events: list[dict]) -> bytes:
    if len(events) == 1:  # most chunks: one text delta
        return _sse(events[0])
    return b"".join([_sse(event) for event in events])


class ResponsesUsage:
    """The response's tokens: the worker's last usage report, else the tokens seen so far (n is 1)."""

    __slots__ = ("prompt", "completion", "cached")

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.cached = 0

    def add(self, chunk: Chunk) -> None:
        if chunk.usage is not None:
            self.prompt = chunk.usage.prompt_tokens
            self.completion = chunk.usage.completion_tokens
            self.cached = chunk.usage.cached_tokens
        else:
            self.completion += len(chunk.token_ids)


class ResponsesOutput:
    """The output of one response: streamed (`start`, `event`..., `end`) or whole (`add`..., `body`)."""

    def __init__(self, response_id: str, model: str, echo: dict) -> None:
        self.response_id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.echo = echo                     # request fields the response object repeats
        self.output: list[dict] = []          # closed items, in order
        self._open: dict | None = None        # the item being streamed
        self._sequence = 0
        self.finish_reason: str | None = None
        self.usage = ResponsesUsage()

    # -- events ----------------------------------------------------------------------------

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def start(self) -> bytes:
        body = self.response(status="in_progress")
        return _joined([self._event("response.created", response=body),
                        self._event("response.in_progress", response=body)])

    def event(self, chunk: Chunk) -> bytes:
        return _joined(self._add(chunk))

    def end(self) -> bytes:
        return _joined(self._finish())

    def error(self, error: ApiError) -> bytes:
        return _sse({"type": "error", "sequence_number": self._sequence, "code": error.code or error.type,
                     "message": error.message, "param": error.param})

    def add(self, chunk: Chunk) -> None:
        self._add(chunk)

    def body(self) -> dict:
        """The final response object (the one response.completed carries)."""
        self._finish()
        return self.response()

    def _add(self, chunk: Chunk) -> list[dict]:
        events: list[dict] = []
        if chunk.reasoning:
            events += self._text_delta("reasoning", chunk.reasoning)
        if chunk.text:
            events += self._text_delta("message", chunk.text)
        for call in chunk.tool_calls or []:
            events += self._tool_call_delta(call)
        self.usage.add(chunk)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        return events

    def _finish(self) -> list[dict]:
        events = self._close()
        return events + [self._event("response.completed", response=self.response())]

    # -- items -----------------------------------------------------------------------------

    def _text_delta(self, kind: str, delta: str) -> list[dict]:
        events: list[dict] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            events += self._open_text(kind)
        item = self._open
        item["_text"].append(delta)
        delta_type = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(delta_type, item_id=item["id"], output_index=len(self.output), content_index=0,
                                  delta=delta, **extra))
        return events

    def _open_text(self, kind: str) -> list[dict]:
        if kind == "message":
            item = {"id": _item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": _item_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self._open = {**item, "_text": []}
        index = len(self.output)
        return [self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                            part=part)]

    def _tool_call_delta(self, call: ToolCallDelta) -> list[dict]:
        events: list[dict] = []
        if call.id or self._open is None or self._open["type"] != "function_call":
            events += self._close()
            item = {"id": _item_id("fc"), "type": "function_call", "call_id": call.id or _item_id("call"),
                    "name": call.name, "arguments": "", "status": "in_progress"}
            self._open = {**item, "_text": []}
            events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        item = self._open
        item["name"] = item["name"] or call.name
        if call.arguments:
            item["_text"].append(call.arguments)
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=len(self.output), delta=call.arguments))
        return events

    def _close(self) -> list[dict]:
        """The done events of the open item, which joins the output."""
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.pop("_text"))
        index, item_id = len(self.output), item["id"]
        if item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            events = [self._event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                  name=item["name"], arguments=text)]
        elif item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item.update(content=[part], status="completed")
            events = [self._event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                                  text=text, logprobs=[]),
                      self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                                  part=part)]
        else:
            part = {"type": "reasoning_text", "text": text}
            item.update(content=[part], status="completed")
            events = [self._event("response.reasoning_text.done", item_id=item_id, output_index=index,
                                  content_index=0, text=text),
                      self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                                  part=part)]
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    # -- the object ------------------------------------------------------------------------

    def response(self, status: str | None = None) -> dict:
        """The response object; its status from the finish reason unless given."""
        if status is None:
            status = "incomplete" if self.finish_reason == "length" else "completed"
        usage = None
        if status != "in_progress":
            tokens = self.usage
            usage = {"input_tokens": tokens.prompt,
                     "input_tokens_details": {"cached_tokens": tokens.cached},
                     "output_tokens": tokens.completion,
                     "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": tokens.prompt + tokens.completion}
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at, "model": self.model,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": list(self.output) if status != "in_progress" else [],
            "usage": usage, "store": False, "background": False, "previous_response_id": None,
            **self.echo,
        }
