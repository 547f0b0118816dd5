"""Whole (non-streamed) OpenAI answers, gathered from a request's chunks: content, reasoning,
tool calls, logprobs, usage."""

from __future__ import annotations

from vllm_fleet.gateway.formats import CompletionLogprobs, ToolCalls, UsageTally, chat_logprobs, prompt_logprobs_body
from vllm_fleet.gateway.translate import Plan
from vllm_fleet.protocol.types import Chunk, PromptLogprob, TokenLogprob


class _Choice:
    __slots__ = ("parts", "reasoning", "tool_calls", "finish_reason", "stop_reason", "logprobs", "started",
                 "prompt_text", "prompt_logprobs")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls = ToolCalls()
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []
        self.started = False
        self.prompt_text = ""
        self.prompt_logprobs: list[PromptLogprob] | None = None


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
            if self.plan.echo_prefix:
                choice.parts.append(self.plan.echo_prefix)
            choice.prompt_text = (chunk.prompt_text or "") if self.plan.echo else ""
        if chunk.prompt_logprobs is not None and choice.prompt_logprobs is None:
            choice.prompt_logprobs = chunk.prompt_logprobs  # once: a resumed stream's are not the client's
        if chunk.finish_reason is not None:
            choice.finish_reason = chunk.finish_reason
            choice.stop_reason = chunk.stop_reason
        if self.plan.echo_only:
            return  # echo with max_tokens 0: the prompt alone (the engine's one token is not shown)
        if chunk.text:
            choice.parts.append(chunk.text)
        if chunk.reasoning:
            choice.reasoning.append(chunk.reasoning)
        if chunk.tool_calls:
            choice.tool_calls.add(chunk.tool_calls)
        if chunk.logprobs:
            choice.logprobs.extend(chunk.logprobs)

    def body(self) -> dict:
        chat = self.plan.kind == "chat"
        choices = [self._chat_choice(i, c) if chat else self._completion_choice(i, c)
                   for i, c in enumerate(self._choices)]
        body = {
            "id": self.response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.plan.model,
            "choices": choices,
            "usage": self.usage.body(),
        }
        prompt_logprobs = self._choices[0].prompt_logprobs if self._choices else None
        if chat and prompt_logprobs is not None:  # vLLM's field, there when it computed them
            body["prompt_logprobs"] = prompt_logprobs_body(prompt_logprobs)
        return body

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
        # echo: the prompt first, then the answer; with logprobs the prompt's tokens come first too.
        logprobs = None
        if self.plan.logprobs is not None:
            prompt = choice.prompt_logprobs if self.plan.echo else None
            logprobs = CompletionLogprobs().body(choice.logprobs, prompt, self.plan.logprobs)
        body = {"index": index, "text": choice.prompt_text + "".join(choice.parts), "logprobs": logprobs,
                "finish_reason": choice.finish_reason}
        if choice.prompt_logprobs is not None:  # vLLM's field, there when it computed them
            body["prompt_logprobs"] = prompt_logprobs_body(choice.prompt_logprobs)
        return body
