"""The previous release's request form, read into this one where it is decoded. Goes in 0.3.

Release 0.1 routers sent sampling as typed `params` beside the OpenAI body (or instead of it, from
Spark and the Python client), chat inputs as typed messages with tool calls as a JSON string,
and n in `params.n`. A worker of this release takes such a request during a rolling upgrade
(workers first, then routers): its typed fields become the body they stood for, so nothing past
`convert.request_from_pb` ever reads a second copy.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.sampling import Constraint, SamplingParams, body_json, endpoint_for, is_constrained
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, GenerateRequest, RequestBody

_OPTIONAL = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "n", "logprobs",
             "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "skip_special_tokens",
             "truncate_prompt_tokens")


def messages(chat: pb.ChatMessages) -> list[dict[str, Any]]:
    """Typed messages as OpenAI dicts; tool calls that are not JSON stay a string, for vLLM to refuse."""
    out = []
    for m in chat.messages:
        message = ChatMessage(m.role, m.content, m.name, m.tool_call_id, reasoning=m.reasoning).to_openai()
        if m.tool_calls_json:
            try:
                message["tool_calls"] = json.loads(m.tool_calls_json)
            except json.JSONDecodeError:
                message["tool_calls"] = m.tool_calls_json
            if not m.content:
                message["content"] = None  # an assistant turn that only calls tools, as OpenAI sends it
        out.append(message)
    return out


def params(msg: pb.SamplingParams) -> SamplingParams:
    typed = SamplingParams(
        stop=list(msg.stop), stop_token_ids=list(msg.stop_token_ids), ignore_eos=msg.ignore_eos,
        logit_bias=dict(msg.logit_bias), bad_words=list(msg.bad_words),
        allowed_token_ids=list(msg.allowed_token_ids), include_stop_str_in_output=msg.include_stop_str_in_output,
    )
    for name in _OPTIONAL:
        if msg.HasField(name):
            setattr(typed, name, getattr(msg, name))
    if msg.HasField("constraint"):
        kind = msg.constraint.WhichOneof("kind")
        if kind == "choice":
            typed.constraint = Constraint(choice=list(msg.constraint.choice.choices))
        elif kind == "json_object":
            typed.constraint = Constraint(json_object=msg.constraint.json_object)
        elif kind is not None:
            typed.constraint = Constraint(**{kind: getattr(msg.constraint, kind)})
    return typed


def request(msg: pb.GenerateRequest, inputs: list[GenerateInput]) -> GenerateRequest:
    """A 0.1 request: an OpenAI body as it was (it already carried the meaning), else the body
    its typed params stood for; n from params either way."""
    typed = params(msg.params)
    if msg.HasField("body"):
        body = RequestBody(msg.body.endpoint, msg.body.body_json or b"{}")
    else:
        endpoint = endpoint_for(inputs)
        body = RequestBody(endpoint, body_json(typed.body_fields(endpoint)))
    return GenerateRequest(
        request_id=msg.request_id, inputs=inputs, body=body, n=typed.n or 1, session_id=msg.session_id,
        priority=msg.priority, stream_interval_ms=msg.stream_interval_ms,
        constrained=msg.constrained or typed.constraint is not None or is_constrained(json.loads(body.body_json)),
        adapter=msg.adapter,
    )
