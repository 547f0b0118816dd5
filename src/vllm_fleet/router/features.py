"""What routing and admission need to know about a request, computed once per request.

Prompt sizes here are estimates: about four characters per token for text, the exact count for
token ids. The worker's tokenizer is what counts for what runs; the router tokenizes only for
cache_aware, with the served model's own tokenizer files (`PromptTokenizer`), and
CacheRouting.match then puts that exact count in place of the estimate. It reads only what it
needs to route: the envelope (inputs, n, session) and its routing hints (the answer length asked
for, `GenerateRequest.hints`), never the body, whose meaning is vLLM's on the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, content_text

CHARS_PER_TOKEN = 4
# Per chat message: role markers and separators added by the chat template.
TEMPLATE_TOKENS_PER_MESSAGE = 4

SHORT, LONG = "short", "long"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """The inputs of a routing decision. `ticket` is a per-request counter: policies that
    rotate or sample derive it from here, so that they stay pure functions.

    What the router's cache index answered for the prompt (who holds its blocks, its frontier)
    is not here: it is a CacheMatch (router/cache/match.py), kept with the prompt's keys and ids
    by the cache hook (router/cache/hook.py) and handed to the policy beside these features. Under
    cache_aware, CacheRouting.match puts the router's token count of the prompt in `prompt_tokens`
    (or, where only a head of a long new text was tokenized, an estimate of the rest from its
    characters)."""

    model: str | None = None
    session_key: str = ""          # session_id (or the OpenAI `user`): session affinity
    prefix_key: str = ""           # the prompt's first characters/tokens: prefix affinity
    prompt_tokens: int = 0         # estimate, all inputs
    max_tokens: int = 0            # output tokens budgeted, all inputs and samples
    workload_class: str = SHORT
    pool: str | None = None        # restrict to workers of this pool (class pools)
    pool_fallback: bool = False    # when `pool` has no routable worker, take any pool's
    ticket: int = 0
    service_class: str = "interactive"  # or "batch" (router/classes/service_class.py)

    @property
    def cost_tokens(self) -> int:
        """Tokens reserved for admission and counted as outstanding while it runs."""
        return self.prompt_tokens + self.max_tokens


def input_prompt_tokens(item: GenerateInput) -> int:
    if item.token_ids is not None:
        return len(item.token_ids)
    if item.messages is not None:
        chars = sum(len(content_text(m.get("content"))) + len(m.get("role", "")) for m in item.messages)
        return chars // CHARS_PER_TOKEN + TEMPLATE_TOKENS_PER_MESSAGE * len(item.messages)
    return len(item.text or "") // CHARS_PER_TOKEN + 1


def prefix_key(item: GenerateInput, length: int) -> str:
    """The first `length` characters of the prompt as the worker will see it (token ids for
    tokenized inputs), so requests sharing a prefix share a key."""
    if item.token_ids is not None:
        return ",".join(map(str, item.token_ids[:length]))
    if item.messages is not None:
        parts, chars = [], 0
        for m in item.messages:   # only as many messages as reach `length` (a long chat: ~5 us less)
            parts.append(f"<{m.get('role', '')}>{content_text(m.get('content'))}")
            chars += len(parts[-1])
            if chars >= length:
                break
        return "".join(parts)[:length]
    return (item.text or "")[:length]


def features_of(
    request: GenerateRequest,
    *,
    model: str | None,
    prefix_chars: int,
    default_max_tokens: int,
    long_prompt_tokens: int,
    long_max_tokens: int,
    class_pools: bool = False,
    class_pool_fallback: bool = False,
    ticket: int = 0,
) -> RequestFeatures:
    samples = max(1, request.n)
    per_input = [input_prompt_tokens(i) for i in request.inputs]   # once: a long chat's is ~5 us
    prompt_tokens = sum(per_input)
    per_sample = request.hints.max_tokens or default_max_tokens
    max_tokens = per_sample * samples * max(1, len(request.inputs))
    longest_prompt = max(per_input, default=0)
    is_long = longest_prompt >= long_prompt_tokens or per_sample >= long_max_tokens
    workload_class = LONG if is_long else SHORT
    return RequestFeatures(
        model=model,
        session_key=request.session_id,
        prefix_key=prefix_key(request.inputs[0], prefix_chars) if request.inputs else "",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        workload_class=workload_class,
        pool=workload_class if class_pools else None,
        pool_fallback=class_pools and class_pool_fallback,
        ticket=ticket,
        service_class=request.hints.service_class,
    )
