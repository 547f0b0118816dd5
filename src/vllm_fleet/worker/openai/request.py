"""An OpenAI request's fields as vLLM's own request model, so that vLLM gives them their meaning.

The gateway forwards the fields vLLM acts on as JSON (`GenerateRequest.openai.body_json`) and
the messages or prompt as typed inputs (the router reads those). Here they become one
`ChatCompletionRequest` (endpoint "chat") or `CompletionRequest` ("completion") per input, and
vLLM's validators run on them. A field they refuse becomes an InvalidRequestError whose `param`
is that field, so the client gets a 400 / INVALID_ARGUMENT naming it.

vLLM names used (both 0.26 and 0.32): `vllm.entrypoints.openai.chat_completion.protocol.
ChatCompletionRequest`, `vllm.entrypoints.openai.completion.protocol.CompletionRequest`.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import ChatMessage, GenerateInput, OpenAIOptions
from vllm_fleet.worker.openai.sampling import invalid_request, vllm_error_types

ENDPOINTS = ("chat", "completion")
_MAX_ERRORS_SHOWN = 3


def message_dict(message: ChatMessage, position: int) -> dict[str, Any]:
    """One typed message as the OpenAI dict vLLM's request model and chat templates take."""
    entry: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        entry["name"] = message.name
    if message.tool_call_id:
        entry["tool_call_id"] = message.tool_call_id
    if message.tool_calls_json:
        try:
            entry["tool_calls"] = json.loads(message.tool_calls_json)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"message {position}: tool_calls is not JSON: {exc}", param="messages") from None
        if not message.content:
            entry["content"] = None  # an assistant turn that only calls tools, as OpenAI sends it
    if message.reasoning:
        entry["reasoning"] = message.reasoning
    return entry


def request_body(openai: OpenAIOptions, item: GenerateInput) -> dict[str, Any]:
    """The forwarded fields plus this input's messages (chat) or prompt (completion)."""
    if openai.endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"unknown OpenAI endpoint {openai.endpoint!r}; use one of {', '.join(ENDPOINTS)}",
                                  param="openai.endpoint")
    try:
        body = json.loads(openai.body_json or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the OpenAI body is not JSON: {exc}", param="openai.body_json") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the OpenAI body must be a JSON object", param="openai.body_json")
    for typed in ("messages", "prompt"):
        if typed in body:
            raise InvalidRequestError(f"the OpenAI body carries {typed!r}; it travels as the request's inputs",
                                      param=typed)
    if openai.endpoint == "chat":
        if item.messages is None:
            raise InvalidRequestError("a chat request needs messages as its input", param="messages")
        body["messages"] = [message_dict(m, i) for i, m in enumerate(item.messages)]
    else:
        if item.messages is not None:
            raise InvalidRequestError("a completion request takes a prompt (text or token ids), not messages",
                                      param="prompt")
        body["prompt"] = list(item.token_ids) if item.token_ids is not None else (item.text or "")
    return body


def build_vllm_request(openai: OpenAIOptions, item: GenerateInput) -> Any:
    """vLLM's ChatCompletionRequest or CompletionRequest for one input; vLLM's validators run.

    Raises InvalidRequestError naming the field vLLM refused.
    """
    from pydantic import ValidationError

    body = request_body(openai, item)
    if openai.endpoint == "chat":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as model
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as model
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except vllm_error_types() as exc:  # a validator that raised vLLM's own error (0.32)
        raise invalid_request(exc) from None


def validation_error(exc: Any) -> InvalidRequestError:
    """pydantic's ValidationError as an InvalidRequestError: param is the first error's field
    (or the field a vLLM validator named), the message lists the first few problems."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = first.get("loc") or ()
    param = str(loc[0]) if loc else getattr((first.get("ctx") or {}).get("error"), "parameter", None)
    problems = []
    for error in errors[:_MAX_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in error.get("loc") or ())
        text = error.get("msg", "invalid")
        if where and "input" in error and not isinstance(error["input"], (dict, list)):
            text += f" (got {error['input']!r:.80})"
        problems.append(f"{where}: {text}" if where else text)
    more = len(errors) - _MAX_ERRORS_SHOWN
    message = "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
    return InvalidRequestError(f"invalid request: {message}", param=param)
