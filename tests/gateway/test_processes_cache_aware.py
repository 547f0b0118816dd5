"""`vllm-fleet gateway --processes 2 --policy cache_aware`: each process keeps its own cache index
from every worker's KV events, so a prefix one process placed is found by the other. In front of
two mock workers with a simulated prefix cache, every follow-up of a prefix lands where its
blocks are held, whichever process routes it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import wait_until, worker_env
from test_gateway_processes import MODEL, children, each_child_answers
from vllm_fleet.processes import GatewayProcess

pytestmark = pytest.mark.timeout(240)
BS = 16
SHARED_BLOCKS = 24


def prompt(prefix: int, suffix: int) -> list[int]:
    """24 blocks shared by every request of `prefix`, then 8 tokens of its own (the mock's
    vocabulary is ids 4..43): the prefill a hit saves outweighs a worker's load."""
    shared = [4 + (prefix * 7 + i * (prefix + 1)) % 40 for i in range(SHARED_BLOCKS * BS)]
    return shared + [4 + (suffix + i) % 40 for i in range(8)]


async def complete(port: int, token_ids: list[int]) -> dict:
    """One completion on a connection of its own, so the kernel picks either process for it."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        answer = await http.post("/v1/completions", json={"model": MODEL, "prompt": token_ids, "max_tokens": 2,
                                                          "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()


def router_counter(text: str, name: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name)


async def test_two_processes_route_each_prefix_where_its_blocks_are_held(mock_worker_factory):
    workers = await mock_worker_factory.start_many(2, served_model_name=MODEL, mock_kv_blocks=1024, block_size=BS,
                                                   mock_ttft_ms=1, mock_tokens_per_s=500)
    args = ["--workers", ",".join(w.address for w in workers), "--processes", "2", "--policy", "cache_aware",
            "--no-access-log"]
    async with GatewayProcess(args, worker_env()) as gateway:
        await gateway.wait_ready(timeout=60)
        await wait_until(lambda: len(children(gateway.pid)) == 2, timeout=30, message="two gateway processes")
        await each_child_answers(gateway.port, children(gateway.pid), 2)  # both listen: either may route below
        prefixes = range(4)
        for prefix in prefixes:
            first = await complete(gateway.port, prompt(prefix, 0))
            assert first["choices"][0]["finish_reason"] == "length"
        await asyncio.sleep(1.0)  # both processes' indexes follow the blocks those requests stored
        cached = []
        for round_ in range(1, 4):
            for prefix in prefixes:
                answer = await complete(gateway.port, prompt(prefix, round_))
                assert answer["choices"][0]["finish_reason"] == "length"
                cached.append(answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
        # Every follow-up found every shared block in the engine it went to: routed by the cache,
        # not by load (two workers by load alone would miss about half of them).
        assert cached == [SHARED_BLOCKS * BS] * (3 * len(prefixes))
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            metrics = (await http.get("/metrics")).text
        assert router_counter(metrics, "vllm_fleet_router_routed_prompt_tokens_total") >= 4 * len(prefixes) * SHARED_BLOCKS * BS
        assert router_counter(metrics, "vllm_fleet_router_predicted_cached_tokens_total") >= 3 * len(prefixes) * SHARED_BLOCKS * BS
