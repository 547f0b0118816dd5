"""The table of `POST /v1/responses` fields, in fields.py's terms (GATEWAY, ENGINE, INERT, REFUSED).

ENGINE fields go to the worker as sent, where vLLM's ResponsesRequest reads them and vLLM's
conversion makes the chat request it runs (worker/openai/responses.py). The stateful fields are
refused: the fleet's gateways (several processes, several hosts) share no response store, so
`previous_response_id`, `background`, GET /v1/responses/{id} and cancel cannot be served soundly.
`store` absent or false is served without storing — what vLLM 0.32 does when store is absent (its
default, VLLM_ENABLE_RESPONSES_API_STORE off, ignores store); `store: true` sent explicitly is
refused rather than ignored. tests/gateway/test_responses_fields.py checks the table against
vLLM's ResponsesRequest.
"""

from __future__ import annotations

from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.gateway.fields import Kind, Rule

_STATELESS = "the fleet keeps no responses (gateways share no store): send the whole conversation as input"
_NO_EXTRAS = "the gateway's responses do not carry it"


def _rule(kind: Kind, why: str, **kw) -> Rule:
    return Rule(kind, why, **kw)


_ENGINE = "vLLM's meaning (ResponsesRequest), on the worker"

RESPONSES: dict[str, Rule] = {
    "model": _rule(Kind.GATEWAY, "picks the workers (404 for a model no worker serves)"),
    "stream": _rule(Kind.GATEWAY, "server-sent Responses events, framed by the gateway"),
    "input": _rule(Kind.GATEWAY, "a string or a list of items; travels as the input, converted to messages by "
                                 "vLLM on the worker"),
    "user": _rule(Kind.GATEWAY, "session key for cache affinity when no x-session-id/session_id is given"),
    "session_id": _rule(Kind.GATEWAY, "session key for cache affinity (after the x-session-id header)"),
    "request_id": _rule(Kind.GATEWAY, "names the answer (resp_<request_id>); the worker request keeps a unique id"),
    "service_tier": _rule(Kind.GATEWAY, "the service class: 'flex' runs as batch; the others as interactive"),
    "priority": _rule(Kind.ENVELOPE, "vLLM's priority scheduling"),
    "metadata": _rule(Kind.GATEWAY, "echoed on the response object; nothing is stored"),
    "instructions": _rule(Kind.ENGINE, "a system message first, by vLLM's conversion"),
    "max_output_tokens": _rule(Kind.ENGINE, "most output tokens (the gateway's --max-tokens-limit applies); "
                                            "reaching it makes the response incomplete"),
    "text": _rule(Kind.ENGINE, "text.format: json_schema / json_object structured output"),
    "tools": _rule(Kind.ENGINE, "function tools only (the client runs them)"),
    "tool_choice": _rule(Kind.ENGINE, "none/auto/required/{type: function, name}; auto needs a worker with "
                                      "--enable-auto-tool-choice"),
    "parallel_tool_calls": _rule(Kind.ENGINE, _ENGINE),
    "reasoning": _rule(Kind.ENGINE, "reasoning.effort, for the chat template"),
    **{name: _rule(Kind.ENGINE, _ENGINE) for name in (
        "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos", "skip_special_tokens",
        "include_stop_str_in_output", "cache_salt", "vllm_xargs", "watermarking", "chat_template_kwargs",
        "structured_outputs")},
    "prompt_cache_key": _rule(Kind.INERT, "OpenAI's cache hint; the router keeps its own affinity"),
    "safety_identifier": _rule(Kind.INERT, "OpenAI's abuse-tracking id", openai_only=True),
    "store": _rule(Kind.REFUSED, "nothing is stored: " + _STATELESS, default=False),
    "previous_response_id": _rule(Kind.REFUSED, _STATELESS),
    "conversation": _rule(Kind.REFUSED, _STATELESS, openai_only=True),
    "background": _rule(Kind.REFUSED, "background responses need a response store; " + _STATELESS,
                        default=False),
    "include": _rule(Kind.REFUSED, _NO_EXTRAS + " (extra output data such as logprobs)", default=[]),
    "top_logprobs": _rule(Kind.REFUSED, _NO_EXTRAS + " (logprobs)", default=0),
    "include_reasoning": _rule(Kind.REFUSED, "reasoning is always included", default=True),
    "max_tool_calls": _rule(Kind.REFUSED, "the fleet runs no built-in tools; the client runs function tools"),
    "prompt": _rule(Kind.REFUSED, "stored prompt templates are not served"),
    "truncation": _rule(Kind.REFUSED, "the input is never truncated; shorten it", default="disabled"),
    "enable_response_messages": _rule(Kind.REFUSED, _NO_EXTRAS + " (raw messages)", default=False),
    "previous_input_messages": _rule(Kind.REFUSED, "harmony-format history is not served; send it as input"),
    "media_io_kwargs": _rule(Kind.REFUSED, "this fleet serves no multimodal inputs"),
    "mm_processor_kwargs": _rule(Kind.REFUSED, "this fleet serves no multimodal inputs"),
    "mm_payload": _rule(Kind.REFUSED, "this fleet serves no multimodal inputs", default="tensors"),
    "return_mm_kwargs": _rule(Kind.REFUSED, "this fleet serves no multimodal inputs"),
    "kv_transfer_params": _rule(Kind.REFUSED, "disaggregated prefill is not served; the router places requests"),
    "ec_transfer_params": _rule(Kind.REFUSED, "disaggregated encoding is not served"),
}


def check(body: dict) -> None:
    """400 naming the first field the table refuses, or does not know."""
    for name, value in body.items():
        rule = RESPONSES.get(name)
        if rule is None:
            raise bad_request(f"unknown field '{name}'", param=name, code="unknown_field")
        if rule.kind is Kind.REFUSED and value is not None and value != rule.default:
            raise bad_request(f"{name} is not supported: {rule.why}", param=name, code="unsupported_field")


def engine_body(body: dict) -> dict:
    """The ENGINE fields the client set (null means vLLM's default: left out)."""
    return {name: value for name, value in body.items()
            if value is not None and RESPONSES[name].kind is Kind.ENGINE}
