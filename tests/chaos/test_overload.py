"""Scenario 6: offered load at 3x capacity, most of it from one abusive key.

The abusive key gets 429 with Retry-After once its budget is spent; every request of a polite
key succeeds; the class queue stays within its bound. Figure: polite P99 TTFT loaded vs
unloaded, max queue depth.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from chaos_support import percentile, stream_completion
from vllm_fleet.gateway.keys import KeyRecord, hash_key, write_keys
from vllm_fleet.router import AdmissionConfig, RouterConfig

pytestmark = pytest.mark.timeout(120)

SLOTS = 8          # 2 workers x max_num_seqs 4
QUEUE = 32
ABUSIVE_PER_MIN = 12


async def test_abusive_key_is_limited_and_polite_key_is_served(workers, start_gateway, tmp_path):
    pool = await workers(2, mock_tokens_per_s=200, mock_ttft_ms=5, max_num_seqs=4)
    keys = tmp_path / "keys.jsonl"
    write_keys(keys, [KeyRecord("polite", hash_key("sk-polite")),
                      KeyRecord("abusive", hash_key("sk-abusive"), limits={"requests_per_min": ABUSIVE_PER_MIN})])
    router = RouterConfig(admission=AdmissionConfig(short_max_in_flight=SLOTS, short_queue_size=QUEUE))
    server = await start_gateway([w.address for w in pool], router=router, api_key_file=str(keys))
    polite_body = {"model": "chaos", "prompt": "polite", "max_tokens": 10, "ignore_eos": True}
    abusive_body = {"model": "chaos", "prompt": "abusive", "max_tokens": 40, "ignore_eos": True}
    polite = {"Authorization": "Bearer sk-polite"}
    abusive = {"Authorization": "Bearer sk-abusive"}
    depths: list[int] = []

    async def sample_depth() -> None:
        while True:
            depths.append(server.router.queue_depths()["short"])
            await asyncio.sleep(0.01)  # a sampling period, not synchronisation

    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=128)) as http:
        unloaded = [await stream_completion(http, polite_body, headers=polite) for _ in range(8)]
        sampler = asyncio.ensure_future(sample_depth())
        abuse = [asyncio.ensure_future(http.post("/v1/completions", json=abusive_body, headers=abusive))
                 for _ in range(3 * SLOTS * 3)]
        loaded = []
        for _ in range(2):
            loaded += await asyncio.gather(*(stream_completion(http, polite_body, headers=polite) for _ in range(SLOTS)))
        abusive_replies = await asyncio.gather(*abuse)
        sampler.cancel()
    assert all(r.status == 200 and r.finish_reason == "length" for r in unloaded + loaded), \
        [(r.status, r.error) for r in loaded]
    limited = [r for r in abusive_replies if r.status_code == 429]
    assert limited, "the abusive key was never limited"
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["message"] for r in limited)
    assert all(r.status_code in (200, 429) for r in abusive_replies)
    assert max(depths) <= QUEUE
    print(f"\n[figure] 3x overload, abusive key {len(limited)}/{len(abusive_replies)} got 429, polite key "
          f"{len(loaded)}/{len(loaded)} ok; polite P99 TTFT {percentile([r.ttft for r in loaded], 99) * 1000:.0f} ms "
          f"loaded vs {percentile([r.ttft for r in unloaded], 99) * 1000:.0f} ms unloaded; "
          f"max queue depth {max(depths)} (bound {QUEUE})")
