"""A request's body and envelope as vLLM's own request model, so that vLLM gives every field its meaning.

The body (`GenerateRequest.body`) holds the client's fields in vLLM's OpenAI shape; the envelope
holds what the fleet schedules: the input (messages or prompt), `n` and `priority`. Here the
two become one `ChatCompletionRequest` (endpoint "chat") or `CompletionRequest` ("completion")
per input, with the envelope's values put in, and vLLM's validators run on what will really
run (a migrated sample's n=1, not the client's n). A field they refuse becomes an
InvalidRequestError whose `param` is that field, so the client gets a 400 / INVALID_ARGUMENT
naming it.

vLLM names used (both 0.26 and 0.32): `vllm.entrypoints.openai.chat_completion.protocol.
ChatCompletionRequest`, `vllm.entrypoints.openai.completion.protocol.CompletionRequest`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    VllmRequest = ChatCompletionRequest | CompletionRequest

# "responses": a Responses API body, read by vLLM's ResponsesRequest and run as chat (responses.py).
# "messages": Anthropic's Messages body, read by openai/messages.py.
ENDPOINTS = ("chat", "completion", "responses", "messages")
# Fields the envelope carries; a body that has them is refused, so no field has two values.
ENVELOPE_FIELDS = {"messages": "the inputs", "prompt": "the inputs", "n": "GenerateRequest.n",
                   "priority": "GenerateRequest.priority"}
_MAX_ERRORS_SHOWN = 3


def request_fields(request: GenerateRequest, item: GenerateInput) -> dict[str, Any]:
    """The body's fields plus what the envelope carries for this input, as one OpenAI request."""
    endpoint = request.body.endpoint
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"unknown endpoint {endpoint!r} in the request body; use one of "
                                  f"{', '.join(ENDPOINTS)}", param="body.endpoint")
    try:
        fields = json.loads(request.body.body_json or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the request body is not JSON: {exc}", param="body") from None
    if not isinstance(fields, dict):
        raise InvalidRequestError("the request body must be a JSON object", param="body")
    for name, carrier in ENVELOPE_FIELDS.items():
        if name in fields:
            raise InvalidRequestError(f"the request body carries {name!r}; it travels in {carrier}", param=name)
    if endpoint == "responses":
        if item.messages is None:
            raise InvalidRequestError("a responses request needs its input items as the input's messages",
                                      param="input")
        fields["input"] = item.messages
    elif endpoint in ("chat", "messages"):
        if item.messages is None:
            raise InvalidRequestError(f"a {endpoint} request needs messages as its input", param="messages")
        fields["messages"] = item.messages
    else:
        if item.messages is not None:
            raise InvalidRequestError("a completion request takes a prompt (text or token ids), not messages",
                                      param="prompt")
        fields["prompt"] = list(item.token_ids) if item.token_ids is not None else (item.text or "")
    fields["n"] = request.n
    if request.priority:
        fields["priority"] = request.priority
    return fields


def build_vllm_request(request: GenerateRequest, item: GenerateInput, *, tokenizer: Any = None,
                       has_reasoning_parser: bool = False) -> VllmRequest:
    """vLLM's ChatCompletionRequest or CompletionRequest for one input; vLLM's validators run.
    An Anthropic Messages body becomes a ChatCompletionRequest by vLLM's conversion (messages.py),
    which reads the engine's chat template (`tokenizer`) and whether it has a reasoning parser.

    Raises InvalidRequestError naming the field vLLM refused.
    """
    from pydantic import ValidationError

    fields = request_fields(request, item)
    if request.body.endpoint == "messages":
        from vllm_fleet.worker.openai.messages import chat_request_from_messages

        return chat_request_from_messages(fields, tokenizer=tokenizer, has_reasoning_parser=has_reasoning_parser)
    if request.body.endpoint == "responses":
        from vllm_fleet.worker.openai.responses import chat_fields

        try:
            fields = chat_fields(fields)
        except ValidationError as exc:
            raise validation_error(exc, "input") from None
        except vllm_error_types() as exc:
            raise invalid_request(exc) from None
    if request.body.endpoint in ("chat", "responses"):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as model
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as model
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(exc, "prompt" if request.body.endpoint == "completion" else "messages") from None
    except vllm_error_types() as exc:  # a validator that raised vLLM's own error (0.32)
        raise invalid_request(exc) from None


def validation_error(exc: Any, input_param: str) -> InvalidRequestError:
    """pydantic's ValidationError as an InvalidRequestError: param is the first error's field
    (or the field a vLLM validator named; `input_param` when the error is inside an input, whose
    location starts at a list index), the message lists the first few problems."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = first.get("loc") or ()
    if loc:
        param = str(loc[0]) if isinstance(loc[0], str) and not loc[0].isdigit() else input_param
    else:
        param = getattr((first.get("ctx") or {}).get("error"), "parameter", None)
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
