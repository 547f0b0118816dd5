"""Chat messages from the request body to the worker's typed `ChatMessage`s.

Text parts are joined with newlines, as vLLM's chat renderer joins them; tool calls travel as
OpenAI's JSON list, `reasoning_content` (the older name) as `reasoning`, as vLLM reads them.
"""

from __future__ import annotations

import json

from vllm_fleet.gateway.schemas import ChatMessageIn
from vllm_fleet.protocol.types import ChatMessage


def chat_messages(messages: list[ChatMessageIn]) -> list[ChatMessage]:
    return [_message(m) for m in messages]


def _message(m: ChatMessageIn) -> ChatMessage:
    tool_calls = ""
    if m.tool_calls:
        tool_calls = json.dumps([call.model_dump() for call in m.tool_calls], ensure_ascii=False)
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    return ChatMessage(role=m.role, content=content_text(m.content), name=m.name or "",
                       tool_call_id=m.tool_call_id or "", tool_calls_json=tool_calls, reasoning=reasoning or "")


def content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


def echo_prefix(messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    """What chat `echo` puts before the answer: vLLM's rule. The answer's role is the assistant's,
    or the last message's when no generation prompt is added; the last message's content is
    echoed only when its role is that role."""
    last = messages[-1]
    role = "assistant" if add_generation_prompt else last.role
    return last.content if last.role == role else ""


def bytes_estimate(messages: list[ChatMessage]) -> int:
    """Prompt bytes of a conversation, for the gateway's token estimate, which must stay a lower
    bound: tool calls and reasoning are left out, since templates may drop or reshape them."""
    return sum(len(m.content.encode()) + len(m.role) + 4 for m in messages)


__all__ = ["bytes_estimate", "chat_messages", "content_text", "echo_prefix"]
