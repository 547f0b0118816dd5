"""`echo` with `logprobs` and vLLM's `prompt_logprobs` (#27), on the real engine: what
log-likelihood harnesses (lm-eval's `echo: true, logprobs: N, max_tokens: 0 or 1`) read.

Two kinds of check:
- against `vllm serve` itself (`slow`: a stock server of the default model beside the shared
  worker, ~60 s and ~3 GB more): the same request to both, field by field; tokens, offsets, ranks
  and text equal, logprobs equal to a tolerance (two engines in float32 on one CPU).
- on the shared worker only (`engine`, CI), through the official openai client: the prompt's
  logprobs are the model's, checked against the logprob the engine gives the same token when it
  generates it (greedy) one position later.

Select with `-m engine` (and `-m slow` for the stock comparison), under the heavy lock.
"""

from __future__ import annotations

import json
import os
import sys

import httpx
import openai
import pytest

from support import wait_until
from vllm_fleet.models import ensure_default_model
from vllm_fleet.processes import ServiceProcess, free_port

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"
TOLERANCE = 2e-3  # logprobs from two engines of the same weights (float32); values are ~-0.1 to -15


@pytest.fixture
async def served(start_gateway, vllm_worker):
    """(gateway url, served model name) in front of the session's real worker."""
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    return server.url, server.router.models()[0]


async def _post(url: str, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        return await http.post(path, json=body)


async def _events(url: str, path: str, body: dict) -> list[dict]:
    events = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        async with http.stream("POST", path, json={**body, "stream": True}) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[len("data: "):]))
    return events


async def test_echo_logprobs_through_the_openai_client(served):
    """lm-eval's request: the prompt's tokens come first, the first with a null logprob, each other
    with the model's logprob of it (the same number the engine gives when it generates that token)."""
    url, model = served
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
    greedy = await client.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    next_token = greedy.choices[0].logprobs.tokens[0]
    next_logprob = greedy.choices[0].logprobs.token_logprobs[0]

    reply = await client.completions.create(model=model, prompt=PROMPT + next_token, max_tokens=0, echo=True,
                                            logprobs=1, temperature=0)
    choice = reply.choices[0]
    lp = choice.logprobs
    assert choice.text == PROMPT + next_token  # max_tokens 0: the prompt alone
    assert "".join(lp.tokens) == PROMPT + next_token
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.tokens[-1] == next_token and lp.token_logprobs[-1] == pytest.approx(next_logprob, abs=TOLERANCE)
    assert reply.usage.prompt_tokens == len(lp.tokens)

    # max_tokens 1, streamed: the prompt's tokens, then the generated one, in the first events.
    stream = await client.completions.create(model=model, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1,
                                             temperature=0, stream=True)
    tokens, logprobs, text = [], [], ""
    async for event in stream:
        if event.choices:
            text += event.choices[0].text
            tokens += event.choices[0].logprobs.tokens if event.choices[0].logprobs else []
            logprobs += event.choices[0].logprobs.token_logprobs if event.choices[0].logprobs else []
    assert text == PROMPT + next_token and "".join(tokens) == text
    assert logprobs[0] is None and logprobs[-1] == pytest.approx(next_logprob, abs=TOLERANCE)


# --- against vllm serve --------------------------------------------------------------------------

@pytest.fixture(scope="module")
async def stock_vllm(vllm_worker):
    """`vllm serve` (vLLM's own OpenAI server) on the default model, as the shared worker runs it."""
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_default_model()),
               "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--host", "127.0.0.1",
               "--port", str(port), "--gpu-memory-utilization", "0.2", "--disable-uvicorn-access-log"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "1",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    server = ServiceProcess(command, env, name=f"vllm serve :{port}").start()
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                return (await http.get(url + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await server.wait_for(ready, 600)
        async with httpx.AsyncClient(timeout=10) as http:
            model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        yield url, model
    finally:
        server.stop()


def _same(ours, theirs, where: str = "") -> None:
    """Equal, floats to TOLERANCE; dicts by key (JSON objects have no order)."""
    if isinstance(theirs, float) or isinstance(ours, float):
        assert ours == pytest.approx(theirs, abs=TOLERANCE), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), f"{where}: keys {set(ours) ^ set(theirs)}"
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), f"{where}: lengths {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


def _choice_fields(choice: dict) -> dict:
    # Fields both servers send; vLLM also sends nulls for fields the gateway leaves out (token_ids, ...).
    return {k: choice.get(k) for k in ("index", "text", "logprobs", "finish_reason", "prompt_logprobs")}


CASES = {
    "echo+logprobs, max_tokens 1": {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 1},
    "echo+logprobs, max_tokens 0": {"prompt": PROMPT, "echo": True, "logprobs": 3, "max_tokens": 0},
    "echo+logprobs, 4 tokens": {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4},
    "prompt_logprobs, no echo": {"prompt": PROMPT, "prompt_logprobs": 2, "max_tokens": 2},
    "echo+logprobs, two prompts": {"prompt": [PROMPT, "Once upon a time"], "echo": True, "logprobs": 0,
                                   "max_tokens": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
async def test_completion_matches_vllm_serve(served, stock_vllm, case):
    url, model = served
    stock_url, stock_model = stock_vllm
    body = {**CASES[case], "temperature": 0}
    ours = await _post(url, "/v1/completions", {**body, "model": model})
    theirs = await _post(stock_url, "/v1/completions", {**body, "model": stock_model})
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    ours, theirs = ours.json(), theirs.json()
    _same([_choice_fields(c) for c in ours["choices"]], [_choice_fields(c) for c in theirs["choices"]], "choices")
    _same(ours["usage"]["prompt_tokens"], theirs["usage"]["prompt_tokens"], "usage.prompt_tokens")
    _same(ours["usage"]["completion_tokens"], theirs["usage"]["completion_tokens"], "usage.completion_tokens")


def _joined(events: list[dict]) -> dict:
    """A stream's events as one choice: text and logprob lists concatenated, the last finish reason."""
    text, finish, lists = "", None, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in events:
        for choice in event["choices"]:
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            for key in lists:
                lists[key] += (choice.get("logprobs") or {}).get(key, [])
    return {"text": text, "finish_reason": finish, "logprobs": lists}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["echo+logprobs, max_tokens 1", "echo+logprobs, max_tokens 0",
                                  "echo+logprobs, 4 tokens"])
async def test_completion_stream_matches_vllm_serve(served, stock_vllm, case):
    url, model = served
    stock_url, stock_model = stock_vllm
    body = {**CASES[case], "temperature": 0}
    ours = await _events(url, "/v1/completions", {**body, "model": model})
    theirs = await _events(stock_url, "/v1/completions", {**body, "model": stock_model})
    _same(_joined(ours), _joined(theirs), "stream")
    # The prompt comes whole in the first event, its logprobs with it.
    prompt_tokens = len(_joined(theirs)["logprobs"]["tokens"]) - (body["max_tokens"] or 0)
    assert len(ours[0]["choices"][0]["logprobs"]["tokens"]) >= prompt_tokens


@pytest.mark.slow
async def test_chat_prompt_logprobs_match_vllm_serve(served, stock_vllm):
    url, model = served
    stock_url, stock_model = stock_vllm
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 3,
            "temperature": 0, "prompt_logprobs": 1}
    ours = await _post(url, "/v1/chat/completions", {**body, "model": model})
    theirs = await _post(stock_url, "/v1/chat/completions", {**body, "model": stock_model})
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    _same(ours.json()["prompt_logprobs"], theirs.json()["prompt_logprobs"], "prompt_logprobs")
    _same(ours.json()["choices"][0]["message"]["content"], theirs.json()["choices"][0]["message"]["content"])
    # vLLM refuses prompt logprobs on a stream; so does the worker, with vLLM's words.
    ours = await _post(url, "/v1/chat/completions", {**body, "model": model, "stream": True})
    theirs = await _post(stock_url, "/v1/chat/completions", {**body, "model": stock_model, "stream": True})
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["param"] == "prompt_logprobs"
