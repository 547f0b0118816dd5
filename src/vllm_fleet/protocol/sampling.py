"""Typed sampling parameters for the Python client and Spark, as builders of the request body.

A request carries sampling meaning in one form only: the body in vLLM's OpenAI shape
(`RequestBody`, see the top of worker.proto). The gateway forwards its client's body; this module
builds the same body from typed, documented parameters, so a request from the gateway, the
Python client or Spark with the same parameters reaches the engine as the same vLLM
SamplingParams (tests/gateway/test_one_form.py checks it against vLLM).

Each field keeps vLLM's name and meaning; None (or empty) leaves it out of the body, so the
model's generation config and then vLLM's default apply. What is checked here is only the shape
of our own typed API (a Constraint sets exactly one kind, JSON text is JSON); vLLM checks the
values on the worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody, RoutingHints

ENDPOINTS = ("chat", "completion")
CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")

# Copied into the body under the same name when set.
_PLAIN_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_p", "skip_special_tokens",
                 "truncate_prompt_tokens")
_LIST_FIELDS = ("stop", "stop_token_ids", "bad_words", "allowed_token_ids")


@dataclass(slots=True)
class Constraint:
    """A structured-output constraint (vLLM's `structured_outputs`); exactly one field is set."""

    json_schema: str | None = None       # a JSON schema, as JSON text
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None           # EBNF
    structural_tag: str | None = None    # as JSON text

    @property
    def kinds(self) -> list[str]:
        return [name for name in CONSTRAINT_KINDS
                if (getattr(self, name) is not None if name != "json_object" else self.json_object)]

    def to_structured_outputs(self) -> dict[str, Any]:
        """vLLM's `structured_outputs` object; ValueError naming the problem for a bad shape."""
        kinds = self.kinds
        if len(kinds) != 1:
            raise ValueError("constraint must set exactly one of " + ", ".join(CONSTRAINT_KINDS)
                             + (f" (it sets {', '.join(kinds)})" if kinds else " (it sets none)"))
        kind = kinds[0]
        if kind == "json_object":
            return {"json_object": True}
        if kind == "json_schema":
            return {"json": _json_text(self.json_schema, "json_schema")}
        if kind == "structural_tag":
            _json_text(self.structural_tag, "structural_tag")  # vLLM takes it as text
            return {"structural_tag": self.structural_tag}
        value = getattr(self, kind)
        if not value:
            raise ValueError(f"constraint.{kind} is empty")
        return {kind: list(value) if kind == "choice" else value}


def _json_text(text: str | None, name: str) -> Any:
    try:
        return json.loads(text or "")
    except json.JSONDecodeError as exc:
        raise ValueError(f"constraint.{name} is not JSON: {exc}") from None


@dataclass(slots=True)
class SamplingParams:
    """vLLM's sampling parameters, typed; None means the model's default, then vLLM's.

    `n` is how many answers each input gets; it travels in the request's envelope, not the body.
    `logprobs` is the number of top alternatives per token (0: the chosen token only): the body
    says it the way the endpoint does (chat: `logprobs` + `top_logprobs`).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    n: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: list[str] = field(default_factory=list)
    allowed_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    constraint: Constraint | None = None

    def body_fields(self, endpoint: str) -> dict[str, Any]:
        """The body an OpenAI client would send for these parameters to `endpoint`."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; use one of {', '.join(ENDPOINTS)}")
        body: dict[str, Any] = {name: getattr(self, name) for name in _PLAIN_FIELDS
                                if getattr(self, name) is not None}
        body.update({name: list(getattr(self, name)) for name in _LIST_FIELDS if getattr(self, name)})
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.include_stop_str_in_output:
            body["include_stop_str_in_output"] = True
        if self.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in self.logit_bias.items()}
        if self.logprobs is not None:
            if endpoint == "chat":
                body.update(logprobs=True, top_logprobs=self.logprobs)
            else:
                body["logprobs"] = self.logprobs
        if self.constraint is not None:
            body["structured_outputs"] = self.constraint.to_structured_outputs()
        return body


def endpoint_for(inputs: list[GenerateInput]) -> str:
    """Chat for messages, completion for text and token ids; one request is one of them."""
    kinds = {"chat" if item.messages is not None else "completion" for item in inputs}
    if len(kinds) > 1:
        raise ValueError("a request's inputs are all chat messages or all prompts (text or token ids), not both")
    return kinds.pop() if kinds else "completion"


def body_json(fields: dict[str, Any]) -> bytes:
    """A body's JSON: NaN and Infinity are refused (they are not JSON, and vLLM would read null)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def build_request(request_id: str, inputs: list[GenerateInput], params: SamplingParams | None = None, *,
                  session_id: str = "", priority: int = 0, adapter: str = "", stream_interval_ms: int = 0,
                  extra_body: dict[str, Any] | None = None, constrained: bool = False,
                  service_class: str = "interactive") -> GenerateRequest:
    """The request the gateway would send for `inputs` with these parameters.

    `extra_body`: further fields of vLLM's request model the typed parameters do not name (e.g.
    `chat_template_kwargs`, `response_format`), with vLLM's meaning. `constrained` marks a stream
    that must not migrate after its first token even with no grammar in the body (one the body
    asks for marks it anyway). `service_class`: "interactive" or "batch" (router/classes/service_class.py).
    ValueError for a bad shape.
    """
    params = params or SamplingParams()
    endpoint = endpoint_for(inputs)
    fields = {**params.body_fields(endpoint), **(extra_body or {})}
    return GenerateRequest(
        request_id=request_id, inputs=inputs, body=RequestBody(endpoint, body_json(fields)),
        n=1 if params.n is None else params.n, session_id=session_id, priority=priority, adapter=adapter,
        stream_interval_ms=stream_interval_ms, constrained=constrained or is_constrained(fields),
        hints=RoutingHints(max_tokens=requested_max_tokens(fields), service_class=service_class),
    )


def requested_max_tokens(fields: dict[str, Any]) -> int | None:
    """The answer length a body asks for per sample: max_completion_tokens, else max_tokens, as
    vLLM reads them (None: up to the context). Only an int counts; vLLM refuses anything else."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = fields.get(name)
        if value is not None:
            return value if type(value) is int else None
    return None


def is_constrained(fields: dict[str, Any]) -> bool:
    """Whether decoding follows a grammar: such a stream cannot migrate after its first token."""
    response_format = fields.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return True
    if fields.get("structured_outputs") is not None:
        return True
    tool_choice = fields.get("tool_choice")
    return tool_choice == "required" or isinstance(tool_choice, dict)


__all__ = ["Constraint", "SamplingParams", "body_json", "build_request", "endpoint_for", "is_constrained",
           "requested_max_tokens"]
