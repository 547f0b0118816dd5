"""What the caller has received of a stream's samples, and the request that resumes after it.

A RoutedStream (stream.py) keeps one Delivered: per (index, sample) the tokens and text the
caller has, whether that sample finished, and each input's prompt count as the worker reported
it. After a worker failure (migration) or a batch pause, `resume` builds the next attempt's
request from it: each unfinished sample re-sent as its own input with n=1 and
`resume_token_ids` = the tokens the caller already has, and the map that brings the new
attempt's chunks back to the caller's (index, sample). `accept` maps each chunk back and
counts it, so completion tokens in a final chunk's usage cover every token delivered.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vllm_fleet.protocol.types import Chunk, GenerateInput, GenerateRequest, Usage


@dataclass(slots=True)
class _Sample:
    """What the caller has received of one (index, sample) stream."""

    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    delivered_before: int = 0   # tokens delivered by earlier attempts
    chars: int = 0              # characters of Chunk.text delivered
    parsed: bool = False        # a parser shaped the text (reasoning, tool calls): chars are not the model's
    tool_calls: bool = False    # a tool call was delivered (the answer is not its text alone)
    text: list[str] | None = None  # the text deltas, where the Delivered keeps them (`keep_text`)


class Delivered:
    """The caller's side of one request's samples, across attempts (the module docstring)."""

    def __init__(self, request: GenerateRequest, *, keep_text: bool = False) -> None:
        self.request = request
        self.keep_text = keep_text                # keep each sample's text for `answer_text`
        self.any = False                          # whether any chunk reached the caller
        self._samples: dict[tuple[int, int], _Sample] = {}
        self._prompt_tokens: dict[int, int] = {}  # per input, as the worker counted them

    def start(self) -> None:
        """Expect every (input, sample) of the request: `request.n` samples of each input."""
        n = max(1, self.request.n)
        self._samples = {(i, s): _Sample(text=[] if self.keep_text else None)
                         for i in range(len(self.request.inputs)) for s in range(n)}

    def tokens(self) -> int:
        """Tokens delivered so far, all samples together."""
        return sum(len(s.token_ids) for s in self._samples.values())

    def unfinished(self) -> int:
        """Samples whose last chunk has not reached the caller yet."""
        return sum(1 for s in self._samples.values() if not s.finished)

    def answered(self) -> bool:
        """Whether every sample's last chunk reached the caller."""
        return all(s.finished for s in self._samples.values())

    def resume(self, attempt_id: str) -> tuple[GenerateRequest, list[tuple[int, int]] | None]:
        """The request to send now as `attempt_id`, and how its (index) maps back to the caller's
        (index, sample) (None: unchanged). Nothing delivered yet → the original request as is."""
        request = self.request
        if not self.any:
            return dataclasses.replace(request, request_id=attempt_id), None
        inputs, mapping = [], []
        for (index, sample), progress in self._samples.items():
            if progress.finished:
                continue
            original = request.inputs[index]
            inputs.append(dataclasses.replace(
                original, resume_token_ids=[*original.resume_token_ids, *progress.token_ids],
                resume_delivered_chars=_delivered_chars(original, progress)))
            progress.delivered_before = len(progress.token_ids)
            mapping.append((index, sample))
        # Each unfinished sample resumes alone: n is the envelope's, the fleet's to schedule; the
        # body, which says the client's n, is not touched.
        return dataclasses.replace(request, request_id=attempt_id, inputs=inputs, n=1), mapping

    def accept(self, chunk: Chunk, mapping: list[tuple[int, int]] | None) -> Chunk:
        """`chunk`, mapped back to the caller's (index, sample) and counted as delivered; a final
        chunk's usage counts the tokens of earlier attempts too."""
        if mapping is not None:
            chunk.index, chunk.sample = mapping[chunk.index]
        progress = self._samples[(chunk.index, chunk.sample)]
        progress.token_ids.extend(chunk.token_ids)
        progress.chars += len(chunk.text)
        if progress.text is not None:
            progress.text.append(chunk.text)
        progress.parsed = progress.parsed or bool(chunk.reasoning or chunk.tool_calls)
        progress.tool_calls = progress.tool_calls or bool(chunk.tool_calls)
        self.any = True
        if chunk.finish_reason is not None:
            progress.finished = True
            if chunk.usage is not None:
                self._prompt_tokens[chunk.index] = chunk.usage.prompt_tokens
            if chunk.usage is not None and progress.delivered_before:
                chunk.usage = Usage(
                    prompt_tokens=chunk.usage.prompt_tokens,
                    completion_tokens=progress.delivered_before + chunk.usage.completion_tokens,
                    cached_tokens=chunk.usage.cached_tokens,
                )
        return chunk

    def answer_text(self) -> str | None:
        """The one answer's whole text as the caller got it (`keep_text`, one input, one sample,
        finished, no tool call); None otherwise."""
        if len(self._samples) != 1:
            return None
        (sample,) = self._samples.values()
        if sample.text is None or not sample.finished or sample.tool_calls:
            return None
        return "".join(sample.text)

    def used_tokens(self, prompt_estimate: int) -> int:
        """Tokens to settle the key's reservation with: the workers' prompt counts where a
        final chunk gave them (`prompt_estimate` otherwise) plus every token delivered."""
        if not self.any:
            return 0
        if len(self._prompt_tokens) == len(self.request.inputs):
            prompt = sum(self._prompt_tokens.values())
        else:
            prompt = prompt_estimate
        return prompt + self.tokens()


def _delivered_chars(original: GenerateInput, progress: _Sample) -> int | None:
    """How much of the resumed tokens' text the caller has; None (all of it) where the router
    cannot count in the model's text: a parser reshaped it, or the input came resumed with all
    of its own resumed text delivered, whose length only a worker can tell."""
    if progress.parsed:
        return None
    if not original.resume_token_ids:
        return progress.chars
    if original.resume_delivered_chars is None:
        return None
    return original.resume_delivered_chars + progress.chars
