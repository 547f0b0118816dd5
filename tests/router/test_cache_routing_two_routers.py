"""Every router keeps its own index from the same event streams (#26 item 5): two routers (two
gateways, or a gateway and a Spark executor) send the same prefix to the worker that holds it,
whichever of them sent it first."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fakes import send_token_ids
from support import wait_until
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig

BS = 16
SHARED_BLOCKS = 24
POLICY = "cache_aware"
# Without homes (a miss to the least loaded, in turn): the first router's placements are then
# spread over both workers for sure, which the second must find from the events alone.
FAST = dict(load_poll_interval_s=0.1, health_poll_interval_s=0.2, cache_home_tokens=0)


def prompt(prefix: int, suffix: int) -> list[int]:
    shared = [4 + (prefix * 11 + i * (prefix + 3)) % 40 for i in range(SHARED_BLOCKS * BS)]
    return shared + [4 + (suffix + i) % 40 for i in range(8)]


send = send_token_ids


async def test_a_second_router_sends_a_prefix_where_the_first_left_it(mock_worker_factory):
    workers = [await mock_worker_factory.start(mock_kv_blocks=1024, block_size=BS, mock_ttft_ms=1,
                                               mock_tokens_per_s=500) for _ in range(2)]
    addresses = [w.address for w in workers]
    routers = [Router(StaticRegistry([WorkerRecord(address=a) for a in addresses]),
                      RouterConfig(policy=POLICY, **FAST), metrics_registry=CollectorRegistry())
               for _ in range(2)]
    first, second = routers
    try:
        for router in routers:
            await router.start()
            await router.wait_ready(timeout=60)
            await wait_until(lambda r=router: all(w.kv_events_fresh for w in r.snapshot()) and
                             len(r.snapshot().eligible()) == 2, timeout=30, message="events followed")
        homes = {}
        for prefix in range(4):  # the first router places four prefixes (spread by load)
            homes[prefix], _ = await send(first, f"a{prefix}", prompt(prefix, 0))
        assert set(homes.values()) == set(addresses)
        # The second router never routed them: it knows where they are only from the engines' events.
        await wait_until(lambda: second._cache.index.entries_per_worker().get(homes[3], 0) >= SHARED_BLOCKS,
                         timeout=10, message="the second router's index holds the first router's blocks")
        for prefix in reversed(range(4)):  # another order than the first's: load alone would not match
            worker, cached = await send(second, f"b{prefix}", prompt(prefix, 1))
            assert worker == homes[prefix], f"prefix {prefix} went elsewhere from the second router"
            assert cached == SHARED_BLOCKS * BS  # and the engine really skipped that prefill
    finally:
        for router in routers:
            await router.close()
