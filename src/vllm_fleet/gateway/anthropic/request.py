"""A Messages request body: the gateway's checks, its field table, and the worker request it becomes.

The body goes to the worker almost as sent (endpoint "messages"): the worker reads it with vLLM's
AnthropicMessagesRequest and converts it with vLLM's own conversion (worker/openai/messages.py).
The gateway checks HTTP shape of what it reads or routes on (model, max_tokens, stream, metadata,
the message list and its blocks' types), refuses what the fleet does not honour (images and
documents; fields below marked REFUSED), and reads the envelope: the messages travel as the
input, `metadata.user_id` is the session key for cache affinity, and a forced tool or an output
format makes the stream constrained (it cannot migrate after its first token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from vllm_fleet.gateway import fields as openai_fields
from vllm_fleet.gateway import forward
from vllm_fleet.gateway.api_error import ApiError, bad_request
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import whole_body_error
from vllm_fleet.gateway.translate import check_lengths
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RoutingHints

ENDPOINT = "messages"

_Kind = openai_fields.Kind
_rule = openai_fields.Rule
_NO_MM = "this fleet serves no multimodal inputs"

# THE table of top-level Messages fields (kinds as in gateway/fields.py). A field in no row is
# refused as unknown; docs/gateway.md shows it.
FIELDS: dict[str, openai_fields.Rule] = {
    "model": _rule(_Kind.GATEWAY, "picks the workers (404 for a model no worker serves)"),
    "messages": _rule(_Kind.GATEWAY, "the input; travels as sent, converted to chat messages on the worker by vLLM"),
    "stream": _rule(_Kind.GATEWAY, "Anthropic's server-sent events, framed by the gateway"),
    "metadata": _rule(_Kind.GATEWAY, "user_id: the session key for cache affinity (after x-session-id)"),
    "max_tokens": _rule(_Kind.ENGINE, "required; the gateway's --max-tokens-limit and context guard apply"),
    "system": _rule(_Kind.ENGINE, "a string or text blocks; vLLM's conversion"),
    "stop_sequences": _rule(_Kind.ENGINE, "vLLM's stop strings; the answer says which one matched"),
    "temperature": _rule(_Kind.ENGINE, "vLLM's meaning, on the worker"),
    "top_p": _rule(_Kind.ENGINE, "vLLM's meaning, on the worker"),
    "top_k": _rule(_Kind.ENGINE, "vLLM's meaning, on the worker"),
    "tools": _rule(_Kind.ENGINE, "tool definitions (input_schema), for the chat template and the tool parser"),
    "tool_choice": _rule(_Kind.ENGINE, "auto/any/tool/none; any and tool constrain decoding (no migration "
                                       "after the first token)"),
    "thinking": _rule(_Kind.ENGINE, "enabled/adaptive need a worker with a reasoning parser (refused by the worker otherwise)"),
    "output_config": _rule(_Kind.ENGINE, "format: a JSON schema for the answer (constrained); effort: the "
                                         "template's reasoning_effort"),
    "cache_salt": _rule(_Kind.ENGINE, "vLLM extension"),
    "watermarking": _rule(_Kind.ENGINE, "vLLM extension"),
    "vllm_xargs": _rule(_Kind.ENGINE, "vLLM extension: arguments for the worker's logits processors"),
    "chat_template_kwargs": _rule(_Kind.ENGINE, "vLLM extension: passed to the chat template"),
    "service_tier": _rule(_Kind.INERT, "Anthropic's capacity tiers; the fleet has one"),
    "cache_control": _rule(_Kind.INERT, "Anthropic's cache breakpoint; workers cache prefixes on their own"),
    "kv_transfer_params": _rule(_Kind.REFUSED, "disaggregated prefill is not served; the router places requests"),
    "ec_transfer_params": _rule(_Kind.REFUSED, "disaggregated encoding is not served"),
    "mm_payload": _rule(_Kind.REFUSED, _NO_MM, default="tensors"),
    "return_mm_kwargs": _rule(_Kind.REFUSED, _NO_MM),
}

# POST /v1/messages/count_tokens: vLLM's AnthropicCountTokensRequest. The count is the prompt's tokens
# as a worker renders it: the worker runs the request with max_tokens 1 (see handler.py).
COUNT_FIELDS: dict[str, openai_fields.Rule] = {
    name: FIELDS[name] for name in ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                                    "chat_template_kwargs")}

# Content block types vLLM's conversion reads; image and document are refused by name.
_BLOCK_TYPES = ("text", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
                "tool_addition", "tool_removal")
_REFUSED_BLOCKS = {"image": _NO_MM, "document": _NO_MM + " (documents)"}
# Keys of a block vLLM's model reads; cache_control is Anthropic's cache hint, which the workers'
# automatic prefix caching covers; citations may come back empty in replayed history.
_BLOCK_KEYS = frozenset(("type", "text", "source", "id", "tool_use_id", "name", "input", "content", "is_error",
                         "tool_name", "thinking", "signature", "data", "tool", "cache_control", "citations"))


def _whole_number(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=512, description="End-user id; the session key for cache affinity")


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["user", "assistant", "system"] = Field(description="Author of the message")
    content: str | list[dict[str, Any]] = Field(description="Text, or content blocks")

    @field_validator("content")
    @classmethod
    def _blocks(cls, content):
        if isinstance(content, list):
            for block in content:
                _check_block(block)
        return content


class MessagesRequest(BaseModel):
    """POST /v1/messages (what the gateway reads; the other fields are judged by FIELDS)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1, max_length=512, description="Model to use; GET /v1/models lists them")
    max_tokens: Annotated[int, Field(ge=1, le=2**31 - 1), BeforeValidator(_whole_number)] = Field(
        description="Most tokens to generate (required)")
    messages: list[MessageIn] = Field(min_length=1, description="The conversation so far")
    stream: bool | None = Field(False, description="Stream the answer as Anthropic's server-sent events")
    metadata: Metadata | None = Field(None, description="user_id: the session key for cache affinity")
    system: str | list[dict[str, Any]] | None = Field(None, description="System prompt: text or text blocks")


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens (what the gateway reads; the other fields are judged by COUNT_FIELDS)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1, max_length=512, description="Model whose tokenizer and template count")
    messages: list[MessageIn] = Field(min_length=1, description="The conversation to count")
    system: str | list[dict[str, Any]] | None = Field(None, description="System prompt: text or text blocks")


def _check_block(block: Any) -> None:
    if not isinstance(block, dict):
        raise ValueError("a content block must be an object")
    kind = block.get("type")
    if kind in _REFUSED_BLOCKS:
        raise ValueError(f"content block type {kind!r} is not supported: {_REFUSED_BLOCKS[kind]}")
    if kind not in _BLOCK_TYPES:
        raise ValueError(f"unknown content block type {kind!r}; one of {', '.join(_BLOCK_TYPES)}")
    unknown = sorted(set(block) - _BLOCK_KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in a {kind} block")
    if kind == "tool_result" and isinstance(block.get("content"), list):
        for item in block["content"]:
            if isinstance(item, dict) and item.get("type") in _REFUSED_BLOCKS:
                raise ValueError(f"tool_result content type {item['type']!r} is not supported: {_NO_MM}")


@dataclass(slots=True)
class AnthropicPlan:
    """What the gateway needs to shape the answer, besides the worker request itself."""

    request: GenerateRequest
    model: str
    stream: bool
    stop_sequences: tuple[str, ...]   # to tell a matched stop string from a stop token


def parse(body: bytes, schema: type[BaseModel] = MessagesRequest,
          table: dict[str, openai_fields.Rule] = FIELDS) -> tuple[Any, dict[str, Any]]:
    """The validated model and the raw JSON object; 400s name the field."""
    try:
        parsed = schema.model_validate_json(body)
    except ValidationError as exc:
        raise _schema_error(exc) from None
    for name, value in (parsed.model_extra or {}).items():
        rule = table.get(name)
        if rule is None:
            raise bad_request(f"unknown field '{name}'", param=name, code="unknown_field")
        if rule.kind is _Kind.REFUSED and value is not None and value != rule.default:
            raise bad_request(f"{name} is not supported: {rule.why}", param=name, code="unsupported_field")
    if isinstance(parsed.system, list):
        for i, block in enumerate(parsed.system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise bad_request(f"system.{i}: only text blocks are supported in system", param=f"system.{i}")
    return parsed, json.loads(body)


def _schema_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False)
    first = next((e for e in errors if e["type"] in ("value_error", "extra_forbidden", "missing")), errors[0])
    if (whole := whole_body_error(first)) is not None:
        return whole
    param = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and "[" in p)) or None
    if first["type"] == "extra_forbidden":
        return bad_request(f"unknown field '{param}'", param=param, code="unknown_field")
    if first["type"] == "missing":
        return bad_request(f"{param}: field required", param=param, code="missing_field")
    return bad_request(f"{param or 'body'}: {first['msg'].removeprefix('Value error, ')}", param=param,
                       code="invalid_value")


def plan(parsed: MessagesRequest, raw: dict[str, Any], *, request_id: str, session_id: str, config: GatewayConfig,
         max_model_len: int | None) -> AnthropicPlan:
    messages = raw["messages"]
    estimate = int(len(json.dumps([raw.get("system"), messages]).encode()) / config.prompt_bytes_per_token)
    check_lengths(estimate, parsed.max_tokens, config, max_model_len, "messages")
    engine = {name: value for name, value in raw.items()
              if FIELDS.get(name) is not None and FIELDS[name].kind is _Kind.ENGINE and value is not None}
    user = parsed.metadata.user_id if parsed.metadata is not None else None
    request = GenerateRequest(
        request_id=request_id, inputs=[GenerateInput(messages=messages)],
        body=forward.request_body(ENDPOINT, engine), session_id=session_id or user or "",
        stream_interval_ms=config.stream_interval_ms, constrained=_is_constrained(engine),
        hints=RoutingHints(max_tokens=parsed.max_tokens))
    stops = engine.get("stop_sequences") or ()
    return AnthropicPlan(request=request, model=parsed.model, stream=bool(parsed.stream),
                         stop_sequences=tuple(s for s in stops if isinstance(s, str)))


def count_request(parsed: CountTokensRequest, raw: dict[str, Any], *, request_id: str, session_id: str,
                  config: GatewayConfig, max_model_len: int | None) -> GenerateRequest:
    """The worker request that counts: the Messages request with max_tokens 1, whose usage
    reports the prompt's tokens as the worker rendered them (the same conversion and template)."""
    engine = {name: value for name, value in raw.items()
              if COUNT_FIELDS.get(name) is not None and COUNT_FIELDS[name].kind is _Kind.ENGINE and value is not None}
    count = MessagesRequest(model=parsed.model, max_tokens=1, messages=parsed.messages)
    counted = plan(count, {**engine, "messages": raw["messages"], "max_tokens": 1}, request_id=request_id,
                   session_id=session_id, config=config, max_model_len=max_model_len)
    return counted.request


def _is_constrained(engine: dict[str, Any]) -> bool:
    """A forced tool (any/tool: vLLM decodes it under a JSON schema) or an output format."""
    choice = engine.get("tool_choice")
    forced = isinstance(choice, dict) and choice.get("type") in ("any", "tool") and bool(engine.get("tools"))
    output = engine.get("output_config")
    return forced or (isinstance(output, dict) and output.get("format") is not None)


def table_markdown() -> str:
    rows = ["| field | handling | why |", "|---|---|---|"]
    rows += [f"| `{name}` | {rule.kind.value} | {rule.why} |" for name, rule in sorted(FIELDS.items())]
    return "\n".join(rows)
