"""Resuming a stream with stop strings (migration, #15): the held-back text and the switch.

With stop strings (and `include_stop_str_in_output` off) vLLM streams token ids at once but
holds back the last len(longest stop) - 1 characters of text: they could begin a stop string,
which is cut from the answer. When the worker dies, the caller has the ids but not that text.
The router says how much text the caller has (`GenerateInput.resume_delivered_chars`), and the
next worker, whose engine sees the resumed tokens as prompt, does two things an uninterrupted
engine would have done:

* it sends the held text before the engine's new text, and keeps holding any part of it that
  could still begin a stop string;
* it matches stop strings that begin in the resumed text and end in the new text (the engine
  only searches its own output), with vLLM's rules: checked token by token, not within the
  first min_tokens tokens, the earliest-ending stop string first (ties in list order), the
  text cut before the stop string (after it with include_stop_str_in_output), token ids kept
  up to the one that completed it. The stream then ends with finish_reason "stop" and
  stop_reason that string, and the engine request is stopped (`ended`).

Stop strings that lie wholly in the new text are the engine's own business: its deltas pass.
A resumed input runs with n=1 (validation.py), so one StopResume serves its one sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_fleet.worker.engines.base import SampleDelta

_CONTEXT_TOKENS = 6   # tokens decoded before a piece so that its leading space comes out as in a stream
_REPLACEMENT = "\ufffd"


def stop_strings(params: Any) -> list[str]:
    """The stop strings of either engine's sampling parameters (vLLM's may be a str or None)."""
    stop = getattr(params, "stop", None)
    if not stop:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def for_resume(decode: Callable[[list[int]], str], prompt_ids: list[int], resumed_ids: list[int],
               delivered_chars: int | None, params: Any) -> StopResume | None:
    """The StopResume of a resumed input, or None when it has nothing to do. `resumed_ids` are
    the resumed tokens the engine gets as prompt (those of a character cut in half are
    regenerated: resume.py); `params` is the engine's parameters.

    Without stop strings vLLM holds no text back, so there is nothing to do whatever the count:
    the held text is found by decoding, which need not match the streamed text character for
    character in every tokenizer, and is only trusted where it is needed."""
    stops = stop_strings(params)
    if not resumed_ids or not stops:
        return None
    text = _continuation(decode, prompt_ids[-_CONTEXT_TOKENS:], resumed_ids)
    delivered = len(text) if delivered_chars is None else max(0, min(delivered_chars, len(text)))
    include = bool(getattr(params, "include_stop_str_in_output", False))
    return StopResume(text, delivered, stops, include_in_output=include, min_tokens=getattr(params, "min_tokens", 0) or 0,
                      decode=decode, context_ids=resumed_ids[-_CONTEXT_TOKENS:])


class StopResume:
    """Filters the engine deltas of one resumed sample; see the module docstring."""

    def __init__(self, resumed_text: str, delivered: int, stops: Sequence[str], *, include_in_output: bool,
                 min_tokens: int, decode: Callable[[list[int]], str], context_ids: list[int]) -> None:
        longest = max((len(s) for s in stops), default=1)
        # Only the resumed text a stop string could still reach, and all that the caller lacks.
        start = min(delivered, max(0, len(resumed_text) - (longest - 1)))
        self._tail = resumed_text[start:]
        self._emitted = delivered - start         # position in the tail up to which text went out
        self._stops = list(stops)
        self._include = include_in_output
        self._min_tokens = min_tokens             # what the engine still owes before stops count
        self._decode = decode
        self._context_ids = context_ids
        self._new_ids: list[int] = []
        self._new_text = ""                       # the new tokens' text, while the window is open
        self._queued = ""                         # engine text waiting behind the held text
        self._open = bool(self._stops)
        self.ended = False                        # a stop string spanning the switch ended the stream
        if not self._spanning_possible():
            self._open = False

    def filter(self, delta: SampleDelta) -> SampleDelta | None:
        """The delta the client should get instead of `delta`; None once the stream has ended."""
        if self.ended:
            return None
        if not self._open:
            delta.text = self._flush() + delta.text
            return delta
        for position, token_id in enumerate(delta.token_ids):
            match = self._add_token(token_id)
            if match is not None:
                return self._end(delta, position + 1, *match)
        self._queued += delta.text
        if delta.finish_reason is not None or not self._spanning_possible():
            self._open = False
            delta.text = self._flush()
            return delta
        delta.text = self._release()
        return delta

    @property
    def pending_text(self) -> str:
        """Text still owed to the client (held, or queued behind it)."""
        return self._tail[self._emitted:] + self._queued

    # --- the window in which a stop string can span the switch --------------------------

    def _add_token(self, token_id: int) -> tuple[str, int] | None:
        """Take one new token; a stop string (and where it starts in tail + new text) that it
        completes across the switch."""
        self._new_ids.append(token_id)
        before = len(self._new_text)
        text = _continuation(self._decode, self._context_ids, self._new_ids)
        self._new_text = text.rstrip(_REPLACEMENT)  # half a character is not text yet
        if len(self._new_ids) <= self._min_tokens or len(self._new_text) <= before:
            return None
        match = earliest_stop(self._tail + self._new_text, len(self._new_text) - before, self._stops)
        if match is None or match[1] >= len(self._tail):
            return None  # none, or wholly in the new text: the engine's own match
        return match

    def _spanning_possible(self) -> bool:
        """Whether some stop string may still begin in the tail and end in text not yet seen."""
        return self._first_open_start() is not None

    def _first_open_start(self) -> int | None:
        """The first position in the tail where the text from there on begins a stop string."""
        text = self._tail + self._new_text
        for start in range(len(self._tail)):
            rest = text[start:]
            if any(len(stop) > len(rest) and stop.startswith(rest) for stop in self._stops):
                return start
        return None

    # --- what goes out --------------------------------------------------------------------

    def _release(self) -> str:
        """The held text that can no longer begin a stop string."""
        limit = self._first_open_start()
        upto = len(self._tail) if limit is None else max(self._emitted, limit)
        out, self._emitted = self._tail[self._emitted:upto], upto
        return out

    def _flush(self) -> str:
        out = self._tail[self._emitted:] + self._queued
        self._emitted, self._queued = len(self._tail), ""
        return out

    def _end(self, delta: SampleDelta, kept: int, stop: str, start: int) -> SampleDelta:
        """The final delta: text up to the stop string (through it if included), ids through
        the token that completed it."""
        cut = start + len(stop) if self._include else start
        text = self._tail + self._new_text
        out = text[self._emitted:cut] if cut > self._emitted else ""
        self._emitted, self._queued, self._open, self.ended = len(self._tail), "", False, True
        delta.text = out
        delta.token_ids = delta.token_ids[:kept]
        if delta.logprobs:
            delta.logprobs = delta.logprobs[:kept]
        delta.finish_reason, delta.stop_reason = "stop", stop
        return delta


def earliest_stop(text: str, new_chars: int, stops: Sequence[str]) -> tuple[str, int] | None:
    """The stop string that ends within the last `new_chars` characters of `text`, ending
    earliest (ties: the first in `stops`), and where it starts; None if none does."""
    best: tuple[str, int] | None = None
    best_end = len(text) + 1
    for stop in stops:
        start = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if start != -1 and start + len(stop) < best_end:
            best, best_end = (stop, start), start + len(stop)
    return best


def _continuation(decode: Callable[[list[int]], str], context_ids: list[int], ids: list[int]) -> str:
    """The text `ids` add after `context_ids`, as a stream shows it (a word's leading space kept)."""
    base = decode(list(context_ids))
    whole = decode([*context_ids, *ids])
    return whole[len(base):] if whole.startswith(base) else decode(list(ids))
