"""Scenario 11: SIGTERM to a gateway process with streams in flight.

The gateway stops accepting connections at once, lets the open streams finish (within its
grace period) and exits 0. Figure: streams dropped.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
import pytest

from chaos_support import stream_completion
from support import free_port, wait_until, worker_env

pytestmark = pytest.mark.timeout(120)

STREAMS = 16


async def _refuses(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            await http.get(url + "/health")
    except httpx.TransportError:
        return True
    return False


async def _serving(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(url + "/ready")).status_code == 200
    except httpx.TransportError:
        return False


async def test_sigterm_drains_streams_and_refuses_new_connections(workers, tmp_path):
    pool = await workers(2, mock_tokens_per_s=20, mock_ttft_ms=5)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "gateway.log", "wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "vllm_fleet.cli", "gateway", "--port", str(port),
         "--workers", ",".join(w.address for w in pool)],
        stdout=log, stderr=subprocess.STDOUT, env=worker_env(), start_new_session=True)
    try:
        await wait_until(lambda: _serving(url), timeout=60, message="the gateway to be ready")
        body = {"model": "chaos", "prompt": "drain me", "max_tokens": 60, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=64)) as http:
            firsts = [asyncio.Event() for _ in range(STREAMS)]
            tasks = [asyncio.ensure_future(stream_completion(http, body, first_token=f)) for f in firsts]
            await wait_until(lambda: all(f.is_set() for f in firsts), timeout=30, message="every stream's first token")
            gateway.send_signal(signal.SIGTERM)
            await wait_until(lambda: _refuses(url), timeout=30, message="new connections to be refused")
            in_flight_when_refused = sum(1 for t in tasks if not t.done())
            results = await asyncio.gather(*tasks, return_exceptions=True)
        dropped = [r for r in results if isinstance(r, BaseException) or r.error or r.finish_reason != "length"]
        assert not dropped, dropped
        assert gateway.wait(timeout=60) == 0, (tmp_path / "gateway.log").read_text()[-3000:]
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
    print(f"\n[figure] gateway SIGTERM with {STREAMS} streams: {in_flight_when_refused} still streaming when new "
          f"connections were already refused; streams dropped {len(dropped)}")
