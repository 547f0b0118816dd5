"""Anthropic's Messages API on the gateway (control plane, mock workers): the official `anthropic`
SDK's create and stream, Anthropic's error bodies, x-api-key auth. What the model answers (tools,
stop sequences) is tested on a real worker in test_messages_real.py."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from gateway_support import MODEL_A

USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def client(gateway):
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key="unused", max_retries=0)


@pytest.fixture
async def http(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        yield client


async def test_create_answers_a_message_with_usage(client):
    message = await client.messages.create(model=MODEL_A, max_tokens=7, messages=USER, system="Be brief.",
                                           metadata={"user_id": "u1"}, thinking={"type": "disabled"},
                                           # This SDK release no longer names the sampling fields; the API has them.
                                           extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20})
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL_A)
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 7 and message.usage.input_tokens > 0


async def test_stream_events_come_in_anthropics_order_and_add_up(client):
    async with client.messages.stream(model=MODEL_A, max_tokens=12, messages=USER) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    raw = [k for k in kinds if k not in ("text",)]  # the SDK adds `text` events beside the deltas
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert "".join(deltas) == final.content[0].text and final.content[0].text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12 and final.usage.input_tokens > 0


async def test_x_api_key_authenticates_and_errors_are_anthropics(start_gateway, mock_fleet, keys_file):
    path, keys = keys_file
    server = await start_gateway([w.address for w in mock_fleet["a"]], api_key_file=str(path))
    good = anthropic.AsyncAnthropic(base_url=server.url, api_key=keys["polite"], max_retries=0)
    message = await good.messages.create(model=MODEL_A, max_tokens=3, messages=USER)
    assert message.usage.output_tokens == 3
    bad = anthropic.AsyncAnthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await bad.messages.create(model=MODEL_A, max_tokens=3, messages=USER)
    assert caught.value.status_code == 401
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"


BAD = [
    # (name, body, status, words the message must hold)
    ("max_tokens missing", {"model": MODEL_A, "messages": USER}, 400, "max_tokens"),
    ("unknown field", {"model": MODEL_A, "max_tokens": 3, "messages": USER, "temprature": 1}, 400, "temprature"),
    ("image block", {"model": MODEL_A, "max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}, 400, "image"),
    ("thinking without a reasoning parser", {"model": MODEL_A, "max_tokens": 1500, "messages": USER,
                                             "thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
    ("bad tool_choice", {"model": MODEL_A, "max_tokens": 3, "messages": USER, "tools": [
        {"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool"}}, 400, "tool_choice"),
    ("refused field", {"model": MODEL_A, "max_tokens": 3, "messages": USER, "kv_transfer_params": {"a": 1}}, 400,
     "kv_transfer_params"),
    ("unknown model", {"model": "claude-9", "max_tokens": 3, "messages": USER}, 404, "claude-9"),
]


@pytest.mark.parametrize("name, body, status, words", BAD, ids=[c[0] for c in BAD])
async def test_bad_input_gets_anthropics_error_body_then_a_good_answer(http, name, body, status, words):
    reply = await http.post("/v1/messages", json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    expected = "not_found_error" if status == 404 else "invalid_request_error"
    assert error["error"]["type"] == expected and words in error["error"]["message"]
    good = await http.post("/v1/messages", json={"model": MODEL_A, "max_tokens": 2, "messages": USER})
    assert good.status_code == 200 and good.json()["content"][0]["text"]


async def test_count_tokens_is_the_prompt_an_answer_reports(client):
    counted = await client.messages.count_tokens(model=MODEL_A, messages=USER, system="Be brief.")
    message = await client.messages.create(model=MODEL_A, max_tokens=2, messages=USER, system="Be brief.")
    assert counted.input_tokens == message.usage.input_tokens > 0
    longer = await client.messages.count_tokens(model=MODEL_A, system="Be brief.", messages=[
        *USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "tell me more about it"}])
    assert longer.input_tokens > counted.input_tokens
