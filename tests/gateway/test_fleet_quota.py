"""One key's quota holds across gateways: two real `vllm-fleet gateway` processes with
`--fleet-quota` on one real ZooKeeper, one keys file, mock workers.

A key of 60 requests per minute, hit through both gateways at once, is admitted about 60
times in all — not 60 per gateway — and the rest get 429 with Retry-After. With ZooKeeper
gone, each gateway admits at most its share (30), says so in /metrics, and keeps serving.

The shared bucket refills at 1 request per second, as a single gateway's does, so the bound
is the limit plus what the burst's own duration refills, + 10 %: on an idle machine the burst
takes a few seconds and the bound is ~66.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway_support import MODEL_A
from support import wait_until, worker_env
from vllm_fleet.gateway.keys import KeyRecord, hash_key, write_keys
from vllm_fleet.processes import GatewayProcess
from zookeeper_server import ZooKeeperServer, zookeeper_server

pytestmark = pytest.mark.timeout(240)

LIMIT = 60
TEAM, OPS = "sk-fleet-team", "sk-fleet-ops"


@pytest.fixture(scope="module")
def zookeeper():
    yield from zookeeper_server()


@pytest.fixture
def keys_path(tmp_path) -> Path:
    path = tmp_path / "keys.jsonl"
    write_keys(path, [KeyRecord("team", hash_key(TEAM), limits={"requests_per_min": LIMIT}),
                      KeyRecord("ops", hash_key(OPS), admin=True)])
    return path


def gateways(worker, keys: Path, zk_hosts: str) -> list[GatewayProcess]:
    url = f"zk://{zk_hosts}/fleet-quota-{uuid.uuid4().hex[:8]}"
    args = ["--workers", worker.address, "--api-key-file", str(keys), "--fleet-quota", url]
    return [GatewayProcess(args, worker_env()) for _ in range(2)]


async def burst(urls: list[str], count: int, concurrency: int = 16) -> list[httpx.Response]:
    """`count` chat requests with the team key, alternating over `urls`, `concurrency` at once."""
    body = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as http:
        async def one(url: str) -> httpx.Response:
            async with gate:
                return await http.post(f"{url}/v1/chat/completions", json=body,
                                       headers={"authorization": f"Bearer {TEAM}"})
        return await asyncio.gather(*(one(url) for url, _ in zip(itertools.cycle(urls), range(count))))


async def gauge(url: str, name: str) -> float | None:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics", headers={"authorization": f"Bearer {OPS}"})).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def check_refusals(responses: list[httpx.Response]) -> None:
    assert {r.status_code for r in responses} <= {200, 429}, [r.text for r in responses if r.status_code >= 500][:3]
    for refused in (r for r in responses if r.status_code == 429):
        assert refused.json()["error"]["code"] == "requests_per_min"
        assert int(refused.headers["retry-after"]) >= 1


async def test_two_gateways_admit_one_keys_limit_once(mock_fleet, keys_path, zookeeper):
    pair = gateways(mock_fleet["a"][0], keys_path, zookeeper.hosts)
    async with pair[0] as a, pair[1] as b:
        await asyncio.gather(a.wait_ready(timeout=60), b.wait_ready(timeout=60))
        await wait_until(lambda: _both_see(a.url, b.url, "vllm_fleet_quota_gateways", 2), timeout=30,
                         message="each gateway to count two gateways")
        started = time.monotonic()
        responses = await burst([a.url, b.url], 2 * LIMIT)
        elapsed = time.monotonic() - started
        admitted = sum(r.status_code == 200 for r in responses)
        check_refusals(responses)
        # Per-gateway buckets would admit 2 x 60. Shared: the limit, plus the burst's own refill.
        assert admitted <= 1.1 * (LIMIT + LIMIT / 60 * elapsed), (admitted, elapsed)
        assert admitted >= 0.9 * LIMIT, (admitted, elapsed)
        assert a.running and b.running


async def test_gateways_cut_off_from_zookeeper_admit_their_share_and_keep_serving(mock_fleet, keys_path):
    workdir = Path(tempfile.mkdtemp(prefix="vllm-fleet-zk-outage-"))
    server = ZooKeeperServer(workdir)
    server.start()
    try:
        pair = gateways(mock_fleet["a"][0], keys_path, server.hosts)
        async with pair[0] as a, pair[1] as b:
            await asyncio.gather(a.wait_ready(timeout=60), b.wait_ready(timeout=60))
            await wait_until(lambda: _both_see(a.url, b.url, "vllm_fleet_quota_gateways", 2), timeout=30,
                             message="each gateway to count two gateways")
            server.stop()
            await wait_until(lambda: _both_see(a.url, b.url, "vllm_fleet_quota_fallback", 1), timeout=30,
                             message="both gateways to report the fallback")
            for gateway in (a, b):
                started = time.monotonic()
                responses = await burst([gateway.url], LIMIT)
                elapsed = time.monotonic() - started
                check_refusals(responses)  # no 5xx: serving goes on without ZooKeeper
                admitted = sum(r.status_code == 200 for r in responses)
                share = LIMIT / 2
                assert 0.9 * share <= admitted <= 1.1 * (share + share / 60 * elapsed), (admitted, elapsed)
            server.start()
            await wait_until(lambda: _both_see(a.url, b.url, "vllm_fleet_quota_fallback", 0), timeout=60,
                             message="both gateways to share the quota again")
            assert a.running and b.running
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _both_see(url_a: str, url_b: str, name: str, value: float) -> bool:
    return await gauge(url_a, name) == value and await gauge(url_b, name) == value
