"""Whole (non-streamed) OpenAI answers, gathered from a request's chunks."""

from __future__ import annotations

from vllm_fleet.gateway.formats import CompletionLogprobs, UsageTally, chat_logprobs
from vllm_fleet.gateway.translate import Plan
from vllm_fleet.protocol.types import Chunk, TokenLogprob


class _Choice:
    __slots__ = ("parts", "finish_reason", "stop_reason", "logprobs")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []


class Aggregate:
    """Collects chunks; `body()` is the chat.completion or text_completion object."""

    def __init__(self, plan: Plan, response_id: str, created: int) -> None:
        self.plan = plan
        self.response_id = response_id
        self.created = created
        self.usage = UsageTally()
        total = plan.n * len(plan.request.inputs)
        self._choices = [_Choice() for _ in range(total)]

    def add(self, chunk: Chunk) -> None:
        self.usage.add(chunk)
        choice = self._choices[chunk.index * self.plan.n + chunk.sample]
        if chunk.text:
            choice.parts.append(chunk.text)
        if chunk.logprobs:
            choice.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            choice.finish_reason = chunk.finish_reason
            choice.stop_reason = chunk.stop_reason

    def body(self) -> dict:
        chat = self.plan.kind == "chat"
        choices = [self._chat_choice(i, c) if chat else self._completion_choice(i, c)
                   for i, c in enumerate(self._choices)]
        return {
            "id": self.response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.plan.model,
            "choices": choices,
            "usage": self.usage.body(),
        }

    def _chat_choice(self, index: int, choice: _Choice) -> dict:
        logprobs = {"content": chat_logprobs(choice.logprobs)} if self.plan.logprobs is not None else None
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(choice.parts)},
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

    def _completion_choice(self, index: int, choice: _Choice) -> dict:
        logprobs = CompletionLogprobs().body(choice.logprobs) if self.plan.logprobs is not None else None
        return {"index": index, "text": "".join(choice.parts), "logprobs": logprobs,
                "finish_reason": choice.finish_reason}
