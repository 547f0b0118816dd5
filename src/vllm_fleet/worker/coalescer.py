"""Coalescing: each (input, sample) stream sends at most one chunk per interval.

The first chunk of a stream and its final chunk go out at once (TTFT and completion are never
delayed); tokens in between are merged until the interval since that stream's last chunk has
passed. With interval 0 every engine step becomes a chunk. Merging keeps the typed parts:
content and reasoning are concatenated, and pieces of the same tool call (same index) become
one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.protocol.types import Chunk, PromptLogprob, TokenLogprob, ToolCallDelta, Usage
from vllm_fleet.worker.engines.base import SampleDelta


@dataclass(slots=True)
class TypedParts:
    """What a delta carries beside its content (`SampleDelta.text`): parser output, echo."""

    reasoning: str = ""
    tool_calls: list[ToolCallDelta] | None = None
    prompt_text: str | None = None
    prompt_logprobs: list[PromptLogprob] | None = None


class _Pending:
    __slots__ = ("text", "token_ids", "logprobs", "reasoning", "tool_calls", "prompt_text", "prompt_logprobs")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None
        self.reasoning: list[str] = []
        self.tool_calls: list[ToolCallDelta] | None = None
        self.prompt_text: str | None = None
        self.prompt_logprobs: list[PromptLogprob] | None = None

    def add(self, delta: SampleDelta, parts: TypedParts | None) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)
        if parts is None:
            return
        if parts.reasoning:
            self.reasoning.append(parts.reasoning)
        if parts.prompt_text is not None:
            self.prompt_text = parts.prompt_text
        if parts.prompt_logprobs is not None:
            self.prompt_logprobs = parts.prompt_logprobs
        for call in parts.tool_calls or ():
            self.tool_calls = merge_tool_call(self.tool_calls or [], call)


def merge_tool_call(calls: list[ToolCallDelta], piece: ToolCallDelta) -> list[ToolCallDelta]:
    """`calls` with `piece` added: appended to the last call when it continues it (same index)."""
    if calls and calls[-1].index == piece.index:
        last = calls[-1]
        calls[-1] = ToolCallDelta(index=last.index, id=last.id or piece.id, name=last.name or piece.name,
                                  arguments=last.arguments + piece.arguments)
    else:
        calls.append(ToolCallDelta(index=piece.index, id=piece.id, name=piece.name, arguments=piece.arguments))
    return calls


class Coalescer:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._last_sent: dict[tuple[int, int], float] = {}

    def add(self, index: int, delta: SampleDelta, now: float, usage: Usage | None = None,
            parts: TypedParts | None = None) -> Chunk | None:
        """Take one delta; return a chunk if one is due now."""
        if not self.interval_s:
            # Every step is a chunk: skip the bookkeeping (this runs once per token per stream,
            # ~10,000 times a second on a busy GPU worker).
            chunk = Chunk(index=index, sample=delta.sample, text=delta.text, token_ids=delta.token_ids,
                          finish_reason=delta.finish_reason, usage=usage, logprobs=delta.logprobs,
                          stop_reason=delta.stop_reason)
            if parts is not None:
                chunk.reasoning, chunk.tool_calls = parts.reasoning, parts.tool_calls or None
                chunk.prompt_text, chunk.prompt_logprobs = parts.prompt_text, parts.prompt_logprobs
            return chunk
        key = (index, delta.sample)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending()
        pending.add(delta, parts)
        last = self._last_sent.get(key)
        if delta.finish_reason is not None or last is None or now - last >= self.interval_s:
            return self._emit(key, now, delta.finish_reason, delta.stop_reason, usage)
        return None

    def next_deadline(self) -> float | None:
        """When the earliest held-back chunk falls due."""
        if not self.interval_s:
            return None
        due = [self._last_sent[k] + self.interval_s for k in self._pending if k in self._last_sent]
        return min(due) if due else None

    def due(self, now: float) -> list[Chunk]:
        keys = [k for k in self._pending if self._last_sent.get(k, now) + self.interval_s <= now]
        return [self._emit(k, now, None, None, None) for k in keys]

    def _emit(self, key: tuple[int, int], now: float, finish_reason: str | None, stop_reason: str | None,
              usage: Usage | None) -> Chunk:
        pending = self._pending.pop(key)
        self._last_sent[key] = now
        return Chunk(
            index=key[0], sample=key[1], text="".join(pending.text), token_ids=pending.token_ids,
            finish_reason=finish_reason, usage=usage, logprobs=pending.logprobs, stop_reason=stop_reason,
            reasoning="".join(pending.reasoning), tool_calls=pending.tool_calls, prompt_text=pending.prompt_text,
            prompt_logprobs=pending.prompt_logprobs,
        )
