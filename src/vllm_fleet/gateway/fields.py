"""THE table of request fields: for each OpenAI endpoint, every field a client may send, and
what the gateway does with it. One place, so no field is ever dropped by accident.

    GATEWAY  the gateway itself implements it (framing, routing, limits); not forwarded.
    ENGINE   forwarded to the worker in the request body (`GenerateRequest.body`), where vLLM's
             own request model gives it its meaning and validates it (the gateway may also read
             some, e.g. `max_tokens`, for its limits and framing).
    ENVELOPE vLLM's meaning too, but the fleet schedules it, so it travels in the request's
             envelope (`GenerateRequest.n`, `.priority`; migration runs each sample with n=1),
             and the worker puts it into vLLM's request model.
    INERT    OpenAI bookkeeping with no effect on the answer: accepted and dropped.
    REFUSED  a 400 naming the field when sent with a value other than its default (`default`,
             or null), with the reason in `why`.

A field in no table is refused as unknown. tests/gateway/test_fields_vs_vllm.py checks the
tables against vLLM's ChatCompletionRequest and CompletionRequest at run time: a vLLM upgrade
that adds a field fails until the field is classified here. `openai_only` marks the names that
are OpenAI's but not fields of vLLM's models. docs/gateway.md shows these tables (a test checks).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vllm_fleet.gateway.api_error import bad_request


class Kind(enum.Enum):
    GATEWAY = "gateway"
    ENGINE = "engine"
    ENVELOPE = "envelope"
    INERT = "inert"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    kind: Kind
    why: str
    default: object = None        # REFUSED: the value that means "not asked for"
    openai_only: bool = False     # OpenAI's field, not one of vLLM's request model


def _gateway(why: str, **kw) -> Rule:
    return Rule(Kind.GATEWAY, why, **kw)


def _engine(why: str = "vLLM's meaning, on the worker", **kw) -> Rule:
    return Rule(Kind.ENGINE, why, **kw)


def _envelope(why: str, **kw) -> Rule:
    return Rule(Kind.ENVELOPE, why, **kw)


def _inert(why: str, **kw) -> Rule:
    return Rule(Kind.INERT, why, **kw)


def _refused(why: str, default: object = None, **kw) -> Rule:
    return Rule(Kind.REFUSED, why, default=default, **kw)


_NO_EXTRAS = "the gateway's responses do not carry it"
_NO_MM = "this fleet serves no multimodal inputs"

# Fields both endpoints share, with the same meaning.
_COMMON: dict[str, Rule] = {
    "model": _gateway("picks the workers (404 for a model no worker serves)"),
    "stream": _gateway("server-sent events, framed by the gateway"),
    "stream_options": _gateway("include_usage: a last usage event; continuous_usage_stats: usage on every event"),
    "user": _gateway("session key for cache affinity when no x-session-id/session_id is given"),
    "session_id": _gateway("session key for cache affinity (after the x-session-id header)"),
    "request_id": _gateway("names the answer (chatcmpl-/cmpl-<request_id>); the worker request keeps a unique id"),
    "n": _envelope("samples per prompt (the gateway's --max-n applies)"),
    "max_tokens": _engine("most tokens per sample (the gateway's --max-tokens-limit and context guard apply)"),
    "temperature": _engine(),
    "top_p": _engine(),
    "top_k": _engine(),
    "min_p": _engine(),
    "seed": _engine(),
    "stop": _engine(),
    "stop_token_ids": _engine(),
    "presence_penalty": _engine(),
    "frequency_penalty": _engine(),
    "repetition_penalty": _engine(),
    "logit_bias": _engine(),
    "ignore_eos": _engine(),
    "min_tokens": _engine(),
    "include_stop_str_in_output": _engine(),
    "skip_special_tokens": _engine(),
    "spaces_between_special_tokens": _engine(),
    "bad_words": _engine(),
    "allowed_token_ids": _engine(),
    "truncate_prompt_tokens": _engine(),
    "truncation_side": _engine(),
    "add_special_tokens": _engine(),
    "response_format": _engine("structured output (json_schema, json_object, structural_tag)"),
    "structured_outputs": _engine("vLLM's structured outputs (json, regex, choice, grammar, ...)"),
    "priority": _envelope("vLLM's priority scheduling; a worker that does not schedule by priority refuses "
                          "a non-zero one"),
    "cache_salt": _engine(),
    "vllm_xargs": _engine("extra arguments for the worker's logits processors"),
    "repetition_detection": _engine(),
    "thinking_token_budget": _engine(),
    "watermarking": _engine(),
    "logprobs": _engine("the gateway's --max-top-logprobs applies"),
    "use_beam_search": _refused("beam search is not served: it cannot stream or migrate", default=False),
    "length_penalty": _refused("applies to beam search only, which is not served", default=1.0),
    "prompt_logprobs": _engine("vLLM's prompt logprobs: answered in vLLM's `prompt_logprobs` field (non-streamed; "
                               "vLLM refuses them with stream)"),
    "logprob_token_ids": _refused(_NO_EXTRAS + " (logprobs of chosen token ids)"),
    "return_tokens_as_token_ids": _refused(_NO_EXTRAS, default=False),
    "return_token_ids": _refused(_NO_EXTRAS, default=False),
    "return_token_offsets": _refused(_NO_EXTRAS, default=False),
    "routed_experts_prompt_start": _refused(_NO_EXTRAS + " (routed-expert data)", default=0),
    "mm_payload": _refused(_NO_MM, default="tensors"),
    "return_mm_kwargs": _refused(_NO_MM),
    "kv_transfer_params": _refused("disaggregated prefill is not served; the router places requests"),
    "ec_transfer_params": _refused("disaggregated encoding is not served"),
    "stream_interval": _refused("the gateway's --stream-interval-ms sets how tokens are grouped into events"),
    "metadata": _inert("OpenAI's stored-completion tags; nothing is stored", openai_only=True),
    "store": _inert("OpenAI's stored completions; nothing is stored", default=False, openai_only=True),
    "service_tier": _gateway("the service class: 'flex' runs as batch (after interactive work, in idle capacity); "
                             "'auto', 'default', 'priority' as interactive", openai_only=True),
    "prompt_cache_key": _inert("OpenAI's cache hint; the router keeps its own affinity", openai_only=True),
    "safety_identifier": _inert("OpenAI's abuse-tracking id", openai_only=True),
}

CHAT: dict[str, Rule] = {
    **_COMMON,
    "messages": _gateway("travel typed (text parts only), for routing and migration"),
    "max_completion_tokens": _engine("newer name of max_tokens; limits as for max_tokens"),
    "top_logprobs": _engine("the gateway's --max-top-logprobs applies"),
    "echo": _gateway("the last message's content starts the answer when its role is the answer's, as vLLM does; "
                     "vLLM then computes prompt logprobs (top_logprobs of them): the whole answer's prompt_logprobs"),
    "tools": _engine("tool definitions for the chat template and the tool parser"),
    "tool_choice": _engine("none/auto/required/named; auto needs a worker with --enable-auto-tool-choice"),
    "parallel_tool_calls": _engine(),
    "reasoning_effort": _engine(),
    "include_reasoning": _engine(),
    "add_generation_prompt": _engine(),
    "continue_final_message": _engine(),
    "documents": _engine(),
    "chat_template_kwargs": _engine("e.g. enable_thinking, passed to the chat template"),
    "return_prompt_text": _refused(_NO_EXTRAS + " (the rendered prompt)", default=False),
    "chat_template": _refused("a request may not bring its own template (vLLM refuses it too unless "
                              "--trust-request-chat-template); the worker's model template applies"),
    "media_io_kwargs": _refused(_NO_MM),
    "mm_processor_kwargs": _refused(_NO_MM),
    "functions": _refused("the deprecated functions API: send tools", openai_only=True),
    "function_call": _refused("the deprecated functions API: send tool_choice", openai_only=True),
    "modalities": _refused("only text answers are served", openai_only=True),
    "audio": _refused("audio answers are not served", openai_only=True),
    "prediction": _refused("predicted outputs are not served", openai_only=True),
    "web_search_options": _refused("web search is not served", openai_only=True),
    "moderation": _refused("moderation is not served", openai_only=True),
    "verbosity": _refused("not a vLLM setting: ask for length in the prompt or with max_tokens", default="medium",
                          openai_only=True),
    "prompt_cache_options": _inert("OpenAI's cache breakpoints; workers cache prefixes on their own", openai_only=True),
    "prompt_cache_retention": _inert("OpenAI's cache lifetime; workers cache prefixes on their own", openai_only=True),
}

COMPLETION: dict[str, Rule] = {
    **_COMMON,
    "prompt": _gateway("strings or token ids, one input each, for routing and migration"),
    "echo": _engine("the worker sends the prompt's text, which starts each choice; with logprobs the prompt's "
                    "tokens start the logprobs (the first's null), from vLLM's prompt logprobs; with max_tokens 0 "
                    "the prompt alone"),
    "suffix": _refused("vLLM does not serve suffix (insertion) completions", default=""),
    "prompt_embeds": _refused("prompt embeddings are not carried to workers"),
    "best_of": _refused("best_of is not served: ask n samples and choose", default=1, openai_only=True),
}

TABLES = {"chat": CHAT, "completion": COMPLETION}


def refuse(endpoint: str, name: str, value: object) -> None:
    """Raise the 400 for a field the table refuses, or does not know; pass otherwise."""
    rule = TABLES[endpoint].get(name)
    if rule is None:
        raise bad_request(f"unknown field '{name}'", param=name, code="unknown_field")
    if rule.kind is Kind.REFUSED and value is not None and value != rule.default:
        raise bad_request(f"{name} is not supported: {rule.why}", param=name, code="unsupported_field")


def engine_fields(endpoint: str) -> frozenset[str]:
    return frozenset(name for name, rule in TABLES[endpoint].items() if rule.kind is Kind.ENGINE)


def table_markdown(endpoint: str) -> str:
    """The table as Markdown rows (docs/gateway.md shows them; a test keeps them equal)."""
    rows = ["| field | handling | why |", "|---|---|---|"]
    for name, rule in sorted(TABLES[endpoint].items()):
        rows.append(f"| `{name}` | {rule.kind.value} | {rule.why} |")
    return "\n".join(rows)


__all__ = ["CHAT", "COMPLETION", "Kind", "Rule", "TABLES", "engine_fields", "refuse", "table_markdown"]
