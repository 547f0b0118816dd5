"""Pieces of OpenAI response bodies shared by streamed and whole answers: usage, logprobs,
tool calls, and the event that ends every stream."""

from __future__ import annotations

from vllm_fleet.protocol.types import Chunk, PromptLogprob, TokenLogprob, ToolCallDelta

# The last event of every OpenAI stream; sse.py writes it, asgi.StreamResponse ends the body on it.
DONE = b"data: [DONE]\n\n"


class UsageTally:
    """Usage of a whole request: prompt tokens once per input, completion tokens of every sample.

    A chunk's usage is its stream's usage so far (workers send it on the last chunk): the last
    report of a sample counts, and the tokens seen of a sample count until one comes.
    """

    __slots__ = ("_prompt", "_cached", "_reported", "_seen")

    def __init__(self) -> None:
        self._prompt: dict[int, int] = {}
        self._cached: dict[int, int] = {}
        self._reported: dict[tuple[int, int], int] = {}
        self._seen: dict[tuple[int, int], int] = {}

    def add(self, chunk: Chunk) -> None:
        key = (chunk.index, chunk.sample)
        self._seen[key] = self._seen.get(key, 0) + len(chunk.token_ids)
        usage = chunk.usage
        if usage is None:
            return
        # Each sample of an input reports the same prompt; count the first report once.
        self._prompt.setdefault(chunk.index, usage.prompt_tokens)
        self._cached.setdefault(chunk.index, usage.cached_tokens)
        self._reported[key] = usage.completion_tokens

    def _completion_of(self, key: tuple[int, int]) -> int:
        reported = self._reported.get(key)
        return reported if reported is not None else self._seen.get(key, 0)

    @property
    def prompt(self) -> int:
        return sum(self._prompt.values())

    @property
    def cached(self) -> int:
        """Prompt tokens read from the prefix cache, once per input."""
        return sum(self._cached.values())

    @property
    def completion(self) -> int:
        return sum(self._completion_of(key) for key in self._seen.keys() | self._reported.keys())

    def body(self) -> dict:
        prompt, completion, cached = self.prompt, self.completion, sum(self._cached.values())
        body = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if cached:
            body["prompt_tokens_details"] = {"cached_tokens": cached}
        return body

    def body_of(self, index: int, sample: int) -> dict:
        """One choice's usage so far, as vLLM's continuous_usage_stats gives it: its input's
        prompt (0 until a worker has reported it) and the tokens of this choice."""
        prompt, completion = self._prompt.get(index, 0), self._completion_of((index, sample))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tool_call_deltas(calls: list[ToolCallDelta]) -> list[dict]:
    """A stream delta's `tool_calls`, in OpenAI's shape: id, type and name on a call's first piece."""
    out = []
    for call in calls:
        piece: dict = {"index": call.index}
        function: dict = {}
        if call.id:
            piece["id"] = call.id
            piece["type"] = "function"
        if call.name:
            function["name"] = call.name
        if call.arguments or call.id:
            function["arguments"] = call.arguments
        if function:
            piece["function"] = function
        out.append(piece)
    return out


class ToolCalls:
    """One choice's tool calls, assembled from their pieces, for a whole answer."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[int, dict] = {}

    def add(self, calls: list[ToolCallDelta]) -> None:
        for call in calls:
            whole = self._calls.setdefault(call.index, {"id": "", "name": "", "arguments": []})
            whole["id"] = whole["id"] or call.id
            whole["name"] = whole["name"] or call.name
            whole["arguments"].append(call.arguments)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def body(self) -> list[dict]:
        return [{"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": "".join(call["arguments"])}}
                for _, call in sorted(self._calls.items())]


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(items: list[TokenLogprob]) -> list[dict]:
    """The `logprobs.content` list of a chat choice."""
    return [
        {**_entry(lp.token, lp.logprob), "top_logprobs": [_entry(tok, p) for _, tok, p in lp.top]}
        for lp in items
    ]


class CompletionLogprobs:
    """The legacy `logprobs` object of a completion choice; keeps text offsets across chunks.

    With `echo` the prompt's tokens come first, as vLLM gives them: the first has no logprob
    (null, and null alternatives), each other has its `top` most likely alternatives plus itself
    (vLLM's first `top`+1 candidates), logprobs floored at -9999 (JSON has no -inf).
    """

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0

    def body(self, items: list[TokenLogprob], prompt: list[PromptLogprob] | None = None, top: int = 0) -> dict:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict | None] = []
        for lp in prompt or ():
            tokens.append(lp.token)
            if lp.logprob is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(max(lp.logprob, LOGPROB_FLOOR))
            top_logprobs.append({tok: max(p, LOGPROB_FLOOR) for _, tok, p, _ in lp.candidates[:top + 1]})
        for lp in items:
            tokens.append(lp.token)
            token_logprobs.append(lp.logprob)
            top_logprobs.append({tok: p for _, tok, p in lp.top})
        offsets = []
        for token in tokens:
            offsets.append(self.offset)
            self.offset += len(token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}


# vLLM's floor for a logprob in an answer (its -inf would not be JSON).
LOGPROB_FLOOR = -9999.0


def prompt_logprobs_body(items: list[PromptLogprob]) -> list[dict | None]:
    """vLLM's own `prompt_logprobs` field (a completion choice's, a chat answer's): per prompt token
    null (the first) or {token id: {logprob, rank, decoded_token}}, in vLLM's order."""
    return [None if lp.logprob is None else
            {str(tid): {"logprob": max(p, LOGPROB_FLOOR), "rank": rank, "decoded_token": tok}
             for tid, tok, p, rank in lp.candidates}
            for lp in items]
