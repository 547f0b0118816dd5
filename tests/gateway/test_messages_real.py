"""Anthropic's Messages API through the gateway to the session's REAL vLLM worker: the official
`anthropic` SDK (create, stream, a forced tool and its result, stop sequences) and LangChain's
ChatAnthropic. A few short requests; select with `-m engine`."""

from __future__ import annotations

import anthropic
import pytest

from support import wait_until

pytestmark = pytest.mark.engine

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # this SDK release no longer names the sampling fields; the API has them
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def gateway(start_gateway, vllm_worker):
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    return server


@pytest.fixture
def client(gateway):
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def model_of(gateway) -> str:
    return gateway.router.models()[0]


async def test_create_with_system_blocks_answers_paris(client, gateway):
    message = await client.messages.create(
        model=model_of(gateway), max_tokens=16, messages=FRANCE, extra_body=GREEDY,
        system=[{"type": "text", "text": "You are a helpful assistant."}])
    text = message.content[0].text
    assert message.content[0].type == "text" and "Paris" in text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 16
    counted = await client.messages.count_tokens(model=model_of(gateway), messages=FRANCE,
                                                 system=[{"type": "text", "text": "You are a helpful assistant."}])
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


async def test_stop_sequence_is_reported(client, gateway):
    message = await client.messages.create(model=model_of(gateway), max_tokens=16, messages=FRANCE,
                                           stop_sequences=["Paris"], extra_body=GREEDY)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Paris")
    assert "Paris" not in message.content[0].text


async def test_stream_events_in_order_and_deltas_add_up(client, gateway):
    async with client.messages.stream(model=model_of(gateway), max_tokens=24, messages=[
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
            {"role": "user", "content": "Write a short sentence about the sea."}]) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    raw = [e.type for e in events if e.type != "text"]  # the SDK adds `text` events beside the deltas
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    deltas = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert deltas == final.content[0].text and deltas
    assert final.stop_reason in ("end_turn", "max_tokens") and 0 < final.usage.output_tokens <= 24


async def test_forced_tool_gives_a_tool_use_block_and_its_result_is_read_next_turn(client, gateway):
    model = model_of(gateway)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = await client.messages.create(model=model, max_tokens=64, messages=ask, tools=[WEATHER],
                                           tool_choice={"type": "tool", "name": "get_weather"})
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input.get("city"), str)
    assert call.id and message.stop_reason == "tool_use"

    async with client.messages.stream(model=model, max_tokens=64, messages=ask, tools=[WEATHER],
                                      tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = [event async for event in stream]
        streamed = await stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    (streamed_call,) = [block for block in streamed.content if block.type == "tool_use"]
    assert isinstance(streamed_call.input, dict) and streamed.stop_reason == "tool_use"

    # tool_choice none: "auto" (the default with tools) needs a worker started with a tool parser, as in vLLM.
    answer = await client.messages.create(model=model, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"},
                                          messages=[
        *ask, {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]}])
    assert answer.content and answer.usage.input_tokens > message.usage.input_tokens


async def test_langchain_chat_anthropic(gateway):
    langchain_anthropic = pytest.importorskip("langchain_anthropic")
    chat = langchain_anthropic.ChatAnthropic(model=model_of(gateway), base_url=gateway.url, api_key="unused",
                                             max_tokens=16, temperature=0, max_retries=0)
    reply = await chat.ainvoke("What is the capital of France?")
    assert "Paris" in reply.text
    assert reply.usage_metadata["output_tokens"] > 0
