"""LangChain's OpenAI chat client (`langchain-openai`'s ChatOpenAI) pointed at the gateway's /v1,
over a REAL vLLM worker (the session's shared one): a plain call and a streamed one."""

from __future__ import annotations

import pytest

from support import wait_until

pytestmark = pytest.mark.engine


async def test_chat_openai_plain_and_streamed(start_gateway, vllm_worker):
    langchain_openai = pytest.importorskip("langchain_openai", reason="the dev extra installs langchain-openai")
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    chat = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=server.router.models()[0],
                                       temperature=0, max_tokens=16, max_retries=0)

    reply = await chat.ainvoke("What is the capital of France?")
    assert "Paris" in reply.content
    assert reply.usage_metadata["input_tokens"] > 5 and 0 < reply.usage_metadata["output_tokens"] <= 16

    pieces = [chunk.content async for chunk in chat.astream("Count from one to five in words.")]
    assert len([p for p in pieces if p]) > 1  # it really streamed
    assert "".join(pieces).strip() and "\ufffd" not in "".join(pieces)
