"""A Responses API request (endpoint "responses") as the chat request vLLM's own conversion makes of it.

vLLM's server reads `/v1/responses` with its `ResponsesRequest`, turns the input items into chat
messages (`construct_input_messages`: instructions as a system message, function_call and
function_call_output items as assistant tool calls and tool messages), renders them with the chat
template, and parses the output with the same tool parsers as chat. The worker does the same:
the body is validated by vLLM's ResponsesRequest (so every field keeps vLLM's meaning and its
refusals), its input converted by vLLM's function, and the result expressed as vLLM's
ChatCompletionRequest, so the worker's one chat path (tool-choice constraints, rendering,
streaming tool-call parsing, migration's resume) runs it. The gateway turns the chat-shaped
chunks into Responses events.

Field by field (vLLM's meaning in ResponsesRequest.to_sampling_params / build_chat_params):
max_output_tokens → max_completion_tokens; text.format json_schema / json_object →
response_format; function tools {name, parameters} → chat tools {function: {...}}; a named
tool_choice {type: function, name} → {type: function, function: {name}}; reasoning.effort →
reasoning_effort; a trailing partial assistant message → continue_final_message. Fields the
fleet does not honour are refused by the gateway's table (gateway/fields.py, "responses").

vLLM names used (checked on 0.32; not yet checked against the 0.26 wheel): vllm.entrypoints.openai.
responses.protocol.ResponsesRequest, vllm.entrypoints.openai.responses.utils.construct_input_messages;
should_continue_final_message only where present, else no partial-message continuation.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet.errors import InvalidRequestError

# Sampling fields whose name and meaning are the same in ResponsesRequest and ChatCompletionRequest.
_SAME_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty",
                "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos", "skip_special_tokens",
                "include_stop_str_in_output", "parallel_tool_calls", "cache_salt", "vllm_xargs", "watermarking",
                "chat_template_kwargs", "structured_outputs", "priority")


def chat_fields(responses_fields: dict[str, Any]) -> dict[str, Any]:
    """The ChatCompletionRequest fields for a Responses body (with its `input` put in); vLLM's
    ResponsesRequest validates it first. Raises pydantic's ValidationError or InvalidRequestError."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    responses_fields = dict(responses_fields)
    samples = responses_fields.pop("n", 1)  # the envelope's n (ResponsesRequest has none; the gateway sends 1)
    request = ResponsesRequest.model_validate(responses_fields)
    sent = request.model_fields_set
    fields: dict[str, Any] = {name: getattr(request, name) for name in _SAME_FIELDS if name in sent}
    fields["n"] = samples
    fields["messages"] = construct_input_messages(request_instructions=request.instructions,
                                                  request_input=request.input)
    fields["messages"] = [_plain(message) for message in fields["messages"]]
    if request.max_output_tokens is not None:
        fields["max_completion_tokens"] = request.max_output_tokens
    if request.reasoning is not None and request.reasoning.effort is not None:
        fields["reasoning_effort"] = request.reasoning.effort
    if _continues_final_message(request.input):
        fields["add_generation_prompt"], fields["continue_final_message"] = False, True
    if request.text is not None and request.text.format is not None:
        fields["response_format"] = _response_format(request.text.format)
    if request.tools:
        fields["tools"] = [_chat_tool(tool) for tool in request.tools]
        fields["tool_choice"] = _chat_tool_choice(request.tool_choice)
    return fields


# Responses text parts, which vLLM's chat renderer reads as text parts (renderers/chat_utils.py) but
# ChatCompletionRequest's content-part types do not admit.
_TEXT_PARTS = ("input_text", "output_text")


def _plain(message: Any) -> Any:
    """vLLM's conversion may keep pydantic objects inside messages (a tool call's function); text
    parts become chat's {"type": "text"}, which the renderer reads alike."""
    if hasattr(message, "model_dump"):
        return _plain(message.model_dump(exclude_none=True))
    if isinstance(message, dict):
        if message.get("type") in _TEXT_PARTS and isinstance(message.get("text"), str):
            return {"type": "text", "text": message["text"]}
        return {key: _plain(value) for key, value in message.items()}
    if isinstance(message, list):
        return [_plain(value) for value in message]
    return message


def _continues_final_message(request_input: Any) -> bool:
    try:
        from vllm.entrypoints.openai.responses.utils import should_continue_final_message
    except ImportError:  # vLLM 0.26: its Responses server has no partial-message continuation either
        return False
    return bool(should_continue_final_message(request_input))


def _response_format(text_format: Any) -> dict[str, Any]:
    kind = text_format.type
    if kind == "json_schema":
        schema = {"name": text_format.name, "schema": text_format.schema_}
        if text_format.strict is not None:
            schema["strict"] = text_format.strict
        return {"type": "json_schema", "json_schema": schema}
    if kind in ("json_object", "text"):
        return {"type": kind}
    raise InvalidRequestError(f"text.format type {kind!r} is not supported", param="text.format")


def _chat_tool(tool: Any) -> dict[str, Any]:
    if getattr(tool, "type", None) != "function":
        raise InvalidRequestError(f"tools of type {getattr(tool, 'type', None)!r} are not served; only function "
                                  "tools (the client runs them)", param="tools")
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters or {}}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if getattr(choice, "type", None) == "function":
        return {"type": "function", "function": {"name": choice.name}}
    raise InvalidRequestError(f"tool_choice of type {getattr(choice, 'type', None)!r} is not supported; use "
                              "none, auto, required or {type: function, name}", param="tool_choice")
