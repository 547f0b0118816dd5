"""The official openai client against the gateway: chat and completions, streamed and whole."""

from __future__ import annotations

import openai
import pytest

from gateway_support import MODEL_A, MODEL_B


@pytest.fixture
def client(gateway):
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


async def test_models_lists_every_model(client):
    models = await client.models.list()
    assert {m.id for m in models.data} == {MODEL_A, MODEL_B}
    assert (await client.models.retrieve(MODEL_B)).id == MODEL_B


async def test_chat_whole(client):
    reply = await client.chat.completions.create(
        model=MODEL_A, messages=[{"role": "user", "content": "hello there"}], max_tokens=7, n=2, seed=1,
        temperature=0.7, top_p=0.9, presence_penalty=0.1, frequency_penalty=0.1, stop=["zzz"], user="u1")
    assert reply.object == "chat.completion" and reply.model == MODEL_A
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.message.role == "assistant" and choice.message.content
        assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 14
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 14


async def test_chat_stream_with_usage_and_logprobs(client):
    stream = await client.chat.completions.create(
        model=MODEL_B, messages=[{"role": "user", "content": "stream please"}], max_completion_tokens=20,
        stream=True, stream_options={"include_usage": True}, logprobs=True, top_logprobs=0)
    text, tokens, usage, finish = "", 0, None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        tokens += len(choice.logprobs.content) if choice.logprobs else 0
        finish = choice.finish_reason or finish
    assert text and finish == "length"
    assert tokens == 20
    assert usage.completion_tokens == 20 and usage.prompt_tokens > 0


async def test_completions_several_prompts(client):
    reply = await client.completions.create(model=MODEL_A, prompt=["one two", "three"], max_tokens=4, n=2,
                                            logprobs=1)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(len(c.logprobs.tokens) == 4 for c in reply.choices)
    assert reply.usage.completion_tokens == 16


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6], [7, 8, 9]]])
async def test_completions_token_id_prompts(client, prompt):
    reply = await client.completions.create(model=MODEL_A, prompt=prompt, max_tokens=3)
    assert len(reply.choices) == (1 if isinstance(prompt[0], int) else 2)
    assert reply.usage.prompt_tokens == sum(len(p) for p in prompt) if isinstance(prompt[0], list) else 3


async def test_completions_stream(client):
    stream = await client.completions.create(model=MODEL_A, prompt="tell me", max_tokens=30, stream=True)
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert len("".join(pieces)) > 0 and len(pieces) >= 2


async def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "model_not_found"
    reply = await client.chat.completions.create(model=MODEL_A, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert reply.choices[0].message.content
