"""Chat completions' `messages` (the conversation) from the request body to the OpenAI message dicts
the worker gets. (Anthropic's Messages API is another door: gateway/anthropic/.)

They travel as the client sent them, validated by the schema, with two readings of vLLM's: text
parts are joined with newlines (as vLLM's chat renderer joins them; the router reads the text), and
`reasoning_content`, the older name, is sent as `reasoning`. Tool calls stay a list of objects,
never re-encoded, so vLLM's request model and the chat template see what `vllm serve` would.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet.gateway.schemas import ChatMessageIn
from vllm_fleet.protocol.types import content_text


def chat_messages(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
    return [_message(m) for m in messages]


def _message(m: ChatMessageIn) -> dict[str, Any]:
    message = m.model_dump(exclude_none=True, exclude={"reasoning_content"})
    # Text parts joined as vLLM joins them; no content is an empty text, except beside tool calls,
    # where OpenAI clients send null and templates test for it.
    message["content"] = None if m.content is None and m.tool_calls else content_text(m.content)
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    if reasoning is not None:
        message["reasoning"] = reasoning
    return message


def echo_prefix(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """What chat `echo` puts before the answer: vLLM's rule. The answer's role is the assistant's,
    or the last message's when no generation prompt is added; the last message's content is
    echoed only when its role is that role."""
    last = messages[-1]
    role = "assistant" if add_generation_prompt else last["role"]
    return content_text(last.get("content")) if last["role"] == role else ""


def bytes_estimate(messages: list[dict[str, Any]]) -> int:
    """Prompt bytes of a conversation, for the gateway's token estimate, which must stay a lower
    bound: tool calls and reasoning are left out, since templates may drop or reshape them."""
    return sum(len(content_text(m.get("content")).encode()) + len(m["role"]) + 4 for m in messages)


__all__ = ["bytes_estimate", "chat_messages", "echo_prefix"]
