"""Coalescing: each (input, sample) stream sends at most one chunk per interval.

The first chunk of a stream and its final chunk go out at once (TTFT and completion are never
delayed); tokens in between are merged until the interval since that stream's last chunk has
passed. With interval 0 every engine step becomes a chunk.
"""

from __future__ import annotations

from vllm_fleet.protocol.types import Chunk, TokenLogprob, Usage
from vllm_fleet.worker.engine import SampleDelta


class _Pending:
    __slots__ = ("text", "token_ids", "logprobs")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None

    def add(self, delta: SampleDelta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)


class Coalescer:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._last_sent: dict[tuple[int, int], float] = {}

    def add(self, index: int, delta: SampleDelta, now: float, usage: Usage | None = None) -> Chunk | None:
        """Take one delta; return a chunk if one is due now."""
        if not self.interval_s:
            # Every step is a chunk: skip the bookkeeping (this runs once per token per stream,
            # ~10,000 times a second on a busy GPU worker).
            return Chunk(index=index, sample=delta.sample, text=delta.text, token_ids=delta.token_ids,
                         finish_reason=delta.finish_reason, usage=usage, logprobs=delta.logprobs,
                         stop_reason=delta.stop_reason)
        key = (index, delta.sample)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending()
        pending.add(delta)
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
        )
