"""Anthropic Messages requests (endpoint "messages") as vLLM's own chat request, by vLLM's conversion.

`vllm serve` answers /v1/messages by reading the body with its `AnthropicMessagesRequest` and
converting it with `AnthropicServingMessages.to_chat_completion_request` into a
`ChatCompletionRequest` (system text, text/tool_use/tool_result/thinking blocks, tools with
input_schema, tool_choice auto/any/tool/none, stop_sequences, sampling fields). The worker does the
same, so every field keeps vLLM's meaning; the chat request then runs the chat path unchanged
(parsers, renderer, sampling params). Only the framing of the answer (Anthropic's events and
message) is the gateway's.

Inline system messages: vLLM merges them into the leading system prompt when the model's chat
template refuses a system message after the first (it renders [system, user, system, user] to
find out). We ask the same question of vLLM's detector with this engine's template.

`thinking` enabled or adaptive needs a reasoning parser (the answer's thinking blocks come from
it): a worker without one refuses the field by name. `thinking: {"type": "disabled"}` is sent to the template as
reasoning_effort "none" (vLLM probes the template for a fallback to "low"; we do not).

vLLM names used: `vllm.entrypoints.anthropic.protocol.AnthropicMessagesRequest`,
`vllm.entrypoints.anthropic.serving.AnthropicServingMessages.to_chat_completion_request` and
its `_detect_merge_inline_system` (vLLM 0.32). A vLLM without them, or whose converter is not a
classmethod (releases before 0.32 are not checked: the GPU machine's 0.26 may be one), refuses the
endpoint with a message that says so; a vLLM whose converter takes fewer keyword arguments gets
only those it takes.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from vllm_fleet.errors import InvalidRequestError

# What the converter needs but the gateway keeps out of the body: the model picks workers, and the
# chat request's model field has no effect on a worker that serves one model.
_PLACEHOLDER_MODEL = "served-model"


def chat_request_from_messages(fields: dict[str, Any], *, tokenizer: Any, has_reasoning_parser: bool) -> Any:
    """vLLM's ChatCompletionRequest for an Anthropic Messages body (with its envelope's messages).

    Raises InvalidRequestError naming the field vLLM (or this worker) refuses.
    """
    from pydantic import ValidationError

    from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types
    from vllm_fleet.worker.openai.request import validation_error

    converter, model = _vllm_converter()
    thinking = fields.get("thinking")
    # "disabled" asks for no thinking, which a model without a reasoning parser honours as it is.
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled") \
            and not has_reasoning_parser:
        raise InvalidRequestError("thinking is not supported by this worker: it runs no reasoning parser "
                                  "(start it with one, e.g. --reasoning-parser, for a model that thinks)",
                                  param="thinking")
    fields = {"model": _PLACEHOLDER_MODEL, **fields}
    n, priority = fields.pop("n", 1), fields.pop("priority", 0)
    try:
        anthropic = model.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(exc, "messages") from None
    kwargs = {"merge_inline_system": _merge_inline_system(_chat_template(tokenizer)),
              "disabled_thinking_effort": "none"}
    accepted = inspect.signature(converter).parameters
    try:
        chat = converter(anthropic, **{k: v for k, v in kwargs.items() if k in accepted})
    except ValidationError as exc:
        raise validation_error(exc, "messages") from None
    except vllm_error_types() as exc:  # e.g. a tool_removal naming an undeclared tool
        raise invalid_request(exc, "messages") from None
    # The converter asks vLLM's server to stream with usage; the worker always streams, so these
    # only matter as flags, and n and priority come from the envelope, as for chat.
    chat.stream, chat.stream_options, chat.n = False, None, n
    if priority:
        chat.priority = priority
    return chat


@functools.cache
def _vllm_converter() -> tuple[Any, Any]:
    try:
        from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    except ImportError as exc:
        raise InvalidRequestError(f"this worker's vLLM has no Anthropic Messages support ({exc}); use "
                                  "/v1/chat/completions", param="model") from None
    # A classmethod in 0.32: usable without vLLM's HTTP server. Elsewhere it is not ours to call.
    static = inspect.getattr_static(AnthropicServingMessages, "to_chat_completion_request", None)
    converter = getattr(AnthropicServingMessages, "to_chat_completion_request", None)
    if not isinstance(static, classmethod):
        raise InvalidRequestError("this worker's vLLM cannot convert Anthropic Messages requests; use "
                                  "/v1/chat/completions", param="model")
    return converter, AnthropicMessagesRequest


def _chat_template(tokenizer: Any) -> str | None:
    try:
        return tokenizer.get_chat_template(None) if tokenizer is not None else None
    except Exception:  # no template at all: vLLM then merges (the safe reading)
        return None


@functools.cache
def _merge_inline_system(template: str | None) -> bool:
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    detect = getattr(AnthropicServingMessages, "_detect_merge_inline_system", None)
    # Without vLLM's detector, merge: every template accepts one leading system message.
    return True if detect is None else bool(detect(template))
