"""Stop strings for the mock engine, with vLLM's streaming behaviour.

vLLM checks stop strings token by token once min_tokens are out, ends at the earliest-ending
match (cutting the text before it, or after it with include_stop_str_in_output, and dropping
tokens after the one that completed it), and while it streams holds back the last
len(longest stop) - 1 characters of text, which could begin a stop string. The mock does the
same, so that a migration test sees the held-back text a real worker leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.resume.stops import earliest_stop, stop_strings

_CONTEXT_TOKENS = 4  # tokens decoded before each new one, so that its text is as in a stream


def apply_stop_strings(steps: Iterator[list[SampleDelta]], params: Any,
                       decode: Callable[[list[int]], str]) -> Iterator[list[SampleDelta]]:
    """`steps` with stop strings applied; ends once every sample has stopped."""
    stops = stop_strings(params)
    if not stops:
        yield from steps
        return
    samples: dict[int, _SampleText] = {}
    for deltas in steps:
        out = []
        for delta in deltas:
            text = samples.setdefault(delta.sample, _SampleText(stops, params, decode))
            if not text.stopped:
                out.append(text.step(delta))
        if not out:
            return
        yield out
        if all(text.stopped for text in samples.values()):
            return


class _SampleText:
    """One sample's output text as vLLM's detokenizer keeps it."""

    def __init__(self, stops: list[str], params: Any, decode: Callable[[list[int]], str]) -> None:
        self._stops = stops
        self._include = bool(getattr(params, "include_stop_str_in_output", False))
        self._min_tokens = getattr(params, "min_tokens", 0) or 0
        self._hold = 0 if self._include else max(len(s) for s in stops) - 1
        self._decode = decode
        self._ids: list[int] = []
        self._text = ""
        self._sent = 0
        self.stopped = False

    def step(self, delta: SampleDelta) -> SampleDelta:
        for position, token_id in enumerate(delta.token_ids):
            before = len(self._text)
            context = self._ids[-_CONTEXT_TOKENS:]
            self._text += self._decode([*context, token_id])[len(self._decode(context)):]
            self._ids.append(token_id)
            if len(self._ids) <= self._min_tokens or len(self._text) == before:
                continue
            match = earliest_stop(self._text, len(self._text) - before, self._stops)
            if match is not None:
                stop, start = match
                self._text = self._text[:start + len(stop) if self._include else start]
                delta.token_ids = delta.token_ids[:position + 1]
                if delta.logprobs:
                    delta.logprobs = delta.logprobs[:position + 1]
                delta.finish_reason, delta.stop_reason = "stop", stop
                break
        self.stopped = delta.finish_reason is not None
        end = len(self._text) if self.stopped else max(self._sent, len(self._text) - self._hold)
        delta.text, self._sent = self._text[self._sent:end], end
        return delta
