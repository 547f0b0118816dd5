"""Guard of chat_render.conversation's shortcut for plain-text content (the common message of a
long chat): it must give what the one text part it stands for gives through the general path."""

from __future__ import annotations

import pytest

from vllm_fleet.router.prompt import chat_render


@pytest.mark.parametrize("fmt", ["string", "openai"])
def test_text_content_renders_as_its_one_text_part(fmt):
    messages = [{"role": "user", "content": "hello", "name": "bob"}, {"role": "assistant", "content": ""},
                {"role": "assistant", "content": "x", "reasoning": "r"},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "developer", "content": "be brief"},
                {"role": "system", "content": "sys"}, {"role": "user", "content": "multi\nline", "task": "t"}]
    as_parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    assert chat_render.conversation(messages, fmt) == chat_render.conversation(as_parts, fmt)


def test_a_system_text_still_loses_the_billing_header():
    messages = [{"role": "system", "content": "x-anthropic-billing-header: abc\nYou are helpful."}]
    assert chat_render.conversation(messages, "string")[0]["content"] == "You are helpful."
