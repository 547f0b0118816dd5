"""/tokenize, /detokenize, the render routes and /version through the gateway, answered by a REAL
vLLM worker (the session's shared one), compared with the model's own tokenizer and with what
generation counts. Select with `-m engine`.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from support import wait_until

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
async def one_worker_gateway(start_gateway, vllm_worker):
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    return server


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from vllm_fleet.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None).path)


async def test_tokenize_and_detokenize_are_vllms(one_worker_gateway, hf_tokenizer):
    model = one_worker_gateway.router.models()[0]
    async with httpx.AsyncClient(base_url=one_worker_gateway.url, timeout=60) as http:
        prompt = "Tokenize me: Paris, 巴黎 🙂"
        reply = await http.post("/tokenize", json={"model": model, "prompt": prompt, "return_token_strs": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["tokens"] == hf_tokenizer(prompt, add_special_tokens=True).input_ids
        assert body["count"] == len(body["tokens"])
        assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(body["tokens"])
        assert body["max_model_len"] == one_worker_gateway.router.model_info(model).max_model_len

        back = await http.post("/detokenize", json={"model": model, "tokens": body["tokens"]})
        assert back.status_code == 200, back.text
        assert back.json()["prompt"] == hf_tokenizer.decode(body["tokens"])

        # A field vLLM's request model does not know is refused by name, never dropped.
        stray = await http.post("/tokenize", json={"model": model, "prompt": "x", "add_bos": True})
        assert stray.status_code == 400 and stray.json()["error"]["param"] == "add_bos", stray.text
        bad_ids = await http.post("/detokenize", json={"model": model, "tokens": "not ids"})
        assert bad_ids.status_code == 400, bad_ids.text
        assert (await http.get("/health")).status_code == 200


async def test_chat_tokenize_counts_what_generation_counts(one_worker_gateway, hf_tokenizer):
    """A client sizing a chat prompt with /tokenize gets the count the completion's usage reports,
    and the same ids /v1/chat/completions/render says the engine would run."""
    model = one_worker_gateway.router.models()[0]
    async with httpx.AsyncClient(base_url=one_worker_gateway.url, timeout=60) as http:
        reply = await http.post("/tokenize", json={"model": model, "messages": MESSAGES,
                                                   "add_generation_prompt": True})
        assert reply.status_code == 200, reply.text
        tokens = reply.json()["tokens"]
        text = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
        assert tokens == hf_tokenizer(text, add_special_tokens=False).input_ids
        without_prompt = await http.post("/tokenize", json={"model": model, "messages": MESSAGES,
                                                            "add_generation_prompt": False})
        assert without_prompt.json()["count"] < len(tokens)

        render = await http.post("/v1/chat/completions/render",
                                 json={"model": model, "messages": MESSAGES, "max_tokens": 5, "temperature": 0})
        assert render.status_code == 200, render.text
        assert render.json()["token_ids"] == tokens

        rendered = await http.post("/v1/completions/render",
                                   json={"model": model, "prompt": ["Hello", "Paris is"], "max_tokens": 3})
        assert rendered.status_code == 200, rendered.text
        assert [r["token_ids"] for r in rendered.json()] == [hf_tokenizer("Hello").input_ids,
                                                              hf_tokenizer("Paris is").input_ids]

    client = openai.AsyncOpenAI(base_url=one_worker_gateway.url + "/v1", api_key="x", max_retries=0)
    answer = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, temperature=0)
    assert answer.usage.prompt_tokens == len(tokens)


async def test_version_is_the_workers_vllm(one_worker_gateway):
    import vllm

    async with httpx.AsyncClient(base_url=one_worker_gateway.url, timeout=30) as http:
        reply = await http.get("/version")
    assert reply.status_code == 200
    assert reply.json()["version"] == vllm.__version__
