"""Pieces of OpenAI response bodies shared by streamed and whole answers: usage, logprobs,
and the event that ends every stream."""

from __future__ import annotations

from vllm_fleet.protocol.types import Chunk, TokenLogprob

# The last event of every OpenAI stream; sse.py writes it, asgi.StreamResponse ends the body on it.
DONE = b"data: [DONE]\n\n"


class UsageTally:
    """Usage of a whole request: prompt tokens once per input, completion tokens of every sample."""

    __slots__ = ("_prompt", "completion", "cached")

    def __init__(self) -> None:
        self._prompt: dict[int, int] = {}
        self.completion = 0
        self.cached = 0

    def add(self, chunk: Chunk) -> None:
        usage = chunk.usage
        if usage is None:
            return
        # Each sample of an input reports the same prompt; count it once.
        if chunk.index not in self._prompt:
            self._prompt[chunk.index] = usage.prompt_tokens
            self.cached += usage.cached_tokens
        self.completion += usage.completion_tokens

    @property
    def prompt(self) -> int:
        return sum(self._prompt.values())

    def body(self) -> dict:
        body = {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion}
        if self.cached:
            body["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return body


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(items: list[TokenLogprob]) -> list[dict]:
    """The `logprobs.content` list of a chat choice."""
    return [
        {**_entry(lp.token, lp.logprob), "top_logprobs": [_entry(tok, p) for _, tok, p in lp.top]}
        for lp in items
    ]


class CompletionLogprobs:
    """The legacy `logprobs` object of a completion choice; keeps text offsets across chunks."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0

    def body(self, items: list[TokenLogprob]) -> dict:
        offsets = []
        for lp in items:
            offsets.append(self.offset)
            self.offset += len(lp.token)
        return {
            "tokens": [lp.token for lp in items],
            "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{tok: p for _, tok, p in lp.top} for lp in items],
            "text_offset": offsets,
        }
