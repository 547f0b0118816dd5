"""From an OpenAI request body to a `GenerateRequest`, with the gateway's own checks.

The gateway owns three kinds of rule, each checked here once, before the router is touched:
HTTP shape (types and absolute bounds, in the pydantic schemas: `parse_body`), which fields
exist at all (fields.py: unknown and refused ones are 400s naming them), and this gateway's
configured limits (--max-n, --max-prompts, --max-top-logprobs, --max-tokens-limit). The
engine's fields go to the worker as sent, in the request body (forward.py), where vLLM's
request model judges them: no rule of vLLM's is restated here. The envelope's fields (n,
priority) are read here, since the envelope is typed. It also refuses, before routing, a request
*certain* to overflow the model's context by a cheap lower bound (bytes per token), so that
multi-megabyte prompts never cost a worker anything. Whether the model is served is the
router's rule (UnknownModelError); the exact engine limits (tokenized prompt + max_tokens
against the context, vocabulary, what the chat template takes) are the worker's and vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from vllm_fleet.gateway import fields, forward
from vllm_fleet.gateway.api_error import ApiError, bad_request
from vllm_fleet.gateway.chat_messages import bytes_estimate, chat_messages, echo_prefix
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import whole_body_error
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.protocol.sampling import is_constrained, requested_max_tokens
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RoutingHints
from vllm_fleet.router.classes.service_class import SERVICE_TIERS


@dataclass(slots=True)
class Plan:
    """What the gateway needs to shape the answer, besides the worker request itself."""

    request: GenerateRequest
    model: str
    kind: str                  # "chat" or "completion"
    stream: bool
    include_usage: bool
    n: int
    logprobs: int | None       # top alternatives per token; None when logprobs are off
    prompt_tokens_estimate: int
    continuous_usage: bool = False  # usage so far on every event (needs include_usage)
    echo: bool = False         # completions: each choice starts with its prompt (the worker's text)
    echo_prefix: str = ""      # chat: what echo puts before every answer
    echo_only: bool = False    # completions: echo with max_tokens 0, the prompt alone (vLLM's extension)
    response_id: str | None = None  # the client's request_id, which names the answer


def parse_body(schema: type[BaseModel], body: bytes) -> BaseModel:
    """Validate JSON `body` against `schema`, then the fields it does not model against fields.py's
    table; a problem becomes a 400 naming the field."""
    try:
        parsed = schema.model_validate_json(body)
    except ValidationError as exc:
        raise _schema_error(exc) from None
    endpoint = "chat" if schema is ChatCompletionRequest else "completion"
    for name, value in (parsed.model_extra or {}).items():
        fields.refuse(endpoint, name, value)
    return parsed


def _schema_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False)
    # Our own validators' words (e.g. an image part) beat a union's "not a string" on another branch.
    first = next((e for e in errors if e["type"] in ("value_error", "extra_forbidden")), errors[0])
    if (whole := whole_body_error(first)) is not None:
        return whole
    param = ".".join(str(p) for p in first["loc"] if not _is_union_tag(p)) or None
    if first["type"] == "extra_forbidden":
        return bad_request(f"unknown field '{param}'", param=param, code="unknown_field")
    message = first["msg"].removeprefix("Value error, ")
    return bad_request(f"{param or 'body'}: {message}", param=param, code="invalid_value")


def _is_union_tag(part: object) -> bool:
    # pydantic names union members in error paths (e.g. "list[str]"); users never wrote those.
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "function-after"))


def chat_plan(body: ChatCompletionRequest, *, request_id: str, session_id: str, config: GatewayConfig,
              max_model_len: int | None) -> Plan:
    """`max_model_len`: the model's context for the pre-routing guard; None skips it (unknown model)."""
    messages = chat_messages(body.messages)
    # How the answer is framed; that top_logprobs needs logprobs is vLLM's rule, on the worker.
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = requested_max_tokens({"max_completion_tokens": body.max_completion_tokens,
                                       "max_tokens": body.max_tokens})
    estimate = int(bytes_estimate(messages) / config.prompt_bytes_per_token)
    plan = _plan(body, "chat", [GenerateInput(messages=messages)], estimate, max_tokens, logprobs,
                 request_id=request_id, session_id=session_id, config=config, max_model_len=max_model_len)
    if body.echo:
        add_generation_prompt = (body.model_extra or {}).get("add_generation_prompt", True)
        plan.echo_prefix = echo_prefix(messages, add_generation_prompt is not False)
    return plan


def completion_plan(body: CompletionRequest, *, request_id: str, session_id: str, config: GatewayConfig,
                    max_model_len: int | None) -> Plan:
    inputs, estimate = _prompt_inputs(body.prompt, config)
    if len(inputs) > config.max_prompts:
        raise bad_request(f"{len(inputs)} prompts in one request; the limit is {config.max_prompts}", param="prompt")
    plan = _plan(body, "completion", inputs, estimate, body.max_tokens, body.logprobs,
                 request_id=request_id, session_id=session_id, config=config, max_model_len=max_model_len)
    # echo with logprobs: vLLM computes the prompt's logprobs (the worker's first chunk carries
    # them) and the answer starts with the prompt's tokens. With max_tokens 0 vLLM runs one token
    # and shows only the prompt (without echo, vLLM's validator refuses max_tokens 0).
    plan.echo = bool(body.echo)
    plan.echo_only = plan.echo and body.max_tokens == 0
    return plan


def _prompt_inputs(prompt, config: GatewayConfig) -> tuple[list[GenerateInput], int]:
    """Inputs, and the largest prompt's token estimate (exact for token ids)."""
    if isinstance(prompt, str):
        return [GenerateInput(text=prompt)], int(len(prompt.encode()) / config.prompt_bytes_per_token)
    if prompt and isinstance(prompt[0], str):
        longest = max(len(p.encode()) for p in prompt)
        return [GenerateInput(text=p) for p in prompt], int(longest / config.prompt_bytes_per_token)
    if prompt and isinstance(prompt[0], int):
        return [GenerateInput(token_ids=list(prompt))], len(prompt)
    return [GenerateInput(token_ids=list(ids)) for ids in prompt], max(len(ids) for ids in prompt)


def _plan(body, kind: str, inputs: list[GenerateInput], estimate: int, max_tokens: int | None,
          logprobs: int | None, *, request_id: str, session_id: str, config: GatewayConfig,
          max_model_len: int | None) -> Plan:
    n = body.n or 1
    if n > config.max_n:
        raise bad_request(f"n={n} is above this gateway's limit of {config.max_n}", param="n")
    if logprobs is not None and logprobs > config.max_top_logprobs:
        raise bad_request(f"at most {config.max_top_logprobs} top logprobs per token", param="logprobs")
    options = body.stream_options
    if options is not None and not body.stream:
        raise bad_request("stream_options can only be given with stream: true", param="stream_options")
    check_lengths(estimate, max_tokens, config, max_model_len, "messages" if kind == "chat" else "prompt")
    prompt_logprobs = (body.model_extra or {}).get("prompt_logprobs")
    if body.stream and isinstance(prompt_logprobs, int) and (prompt_logprobs > 0 or prompt_logprobs == -1):
        # vLLM's rule, which its validator on the worker cannot apply: the worker always streams,
        # and the body it gets does not say whether the client's answer is a stream.
        raise bad_request("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
    forwarded = forward.engine_body(kind, body)
    request = GenerateRequest(
        request_id=request_id, inputs=inputs, body=forward.request_body(kind, forwarded), n=n,
        priority=forward.priority_of(body), session_id=session_id or body.session_id or body.user or "",
        stream_interval_ms=config.stream_interval_ms, constrained=is_constrained(forwarded),
        hints=RoutingHints(max_tokens=max_tokens, service_class=SERVICE_TIERS[body.service_tier or "default"]),
    )
    include_usage = bool(options and options.include_usage)
    return Plan(request=request, model=body.model, kind=kind, stream=bool(body.stream), include_usage=include_usage,
                n=n, logprobs=logprobs, prompt_tokens_estimate=estimate,
                continuous_usage=include_usage and bool(options.continuous_usage_stats),
                response_id=body.request_id)


def check_lengths(estimate: int, max_tokens: int | None, config: GatewayConfig, max_model_len: int | None,
                  prompt_param: str, max_tokens_param: str = "max_tokens") -> None:
    """--max-tokens-limit (capped by the context), then the context guard on the prompt estimate
    (a lower bound of the prompt's tokens). The same limits for every generating door; the
    messages name the door's own fields (`prompt_param`, `max_tokens_param`)."""
    limits = [x for x in (config.max_tokens_limit, max_model_len) if x is not None]
    if max_tokens is not None and limits and max_tokens > min(limits):
        raise bad_request(f"{max_tokens_param}={max_tokens} is above the limit of {min(limits)} for this model",
                          param=max_tokens_param)
    if max_model_len is None:
        return
    # `estimate` is a lower bound: what passes here may still be refused by the worker, which
    # counts real tokens; what fails here would certainly be.
    if estimate >= max_model_len:
        raise bad_request(
            f"the prompt is too long: about {estimate} tokens or more, and the model's context is {max_model_len} "
            "tokens; shorten the prompt", param=prompt_param, code="context_length_exceeded")
    if max_tokens is not None and estimate + max_tokens > max_model_len:
        raise bad_request(
            f"prompt (at least ~{estimate} tokens) plus {max_tokens_param}={max_tokens} exceeds the model's context "
            f"of {max_model_len} tokens; lower {max_tokens_param}", param=max_tokens_param,
            code="context_length_exceeded")


__all__ = ["Plan", "chat_plan", "check_lengths", "completion_plan", "parse_body"]
