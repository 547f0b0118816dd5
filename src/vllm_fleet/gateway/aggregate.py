"""Whole (non-streamed) OpenAI answers, gathered from a request's chunks: content, reasoning,
tool calls, logprobs, usage."""

from __future__ import annotations

from vllm_fleet.gateway.formats import CompletionLogprobs, ToolCalls, UsageTally, chat_logprobs
from vllm_fleet.gateway.translate import Plan
from vllm_fleet.protocol.types import Chunk, TokenLogprob


class _Choice:
    __slots__ = ("parts", "reasoning", "tool_calls", "finish_reason", "stop_reason", "logprobs", "started")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls = ToolCalls()
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []
        self.started = False


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
        if not choice.started:
            choice.started = True
            # echo: chat's from the conversation (vLLM's rule, in the plan), completions' from the worker
            prefix = self.plan.echo_prefix or (chunk.prompt_text if self.plan.echo else None)
            if prefix:
                choice.parts.append(prefix)
        if chunk.text:
            choice.parts.append(chunk.text)
        if chunk.reasoning:
            choice.reasoning.append(chunk.reasoning)
        if chunk.tool_calls:
            choice.tool_calls.add(chunk.tool_calls)
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
        message: dict = {"role": "assistant", "content": "".join(choice.parts)}
        if choice.reasoning:
            message["reasoning"] = "".join(choice.reasoning)  # vLLM 0.32's key
        if choice.tool_calls:
            message["tool_calls"] = choice.tool_calls.body()
            message["content"] = message["content"] or None  # OpenAI: no text beside the calls
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": choice.finish_reason}

    def _completion_choice(self, index: int, choice: _Choice) -> dict:
        logprobs = CompletionLogprobs().body(choice.logprobs) if self.plan.logprobs is not None else None
        return {"index": index, "text": "".join(choice.parts), "logprobs": logprobs,
                "finish_reason": choice.finish_reason}
