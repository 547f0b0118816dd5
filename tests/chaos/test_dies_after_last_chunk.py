"""A worker killed after it sent a request's last chunk but before the stream's closing status.

Found by scenario 10 (about 1 row in 1,000 while workers were killed under a Spark job): the
router took the broken stream for a failed attempt and "resumed" a request whose samples had
all finished, i.e. sent a request with no inputs, which the next worker refused as invalid, so
a complete answer came back as an error. The window is too narrow to hit with a real kill on
demand, so the client's stream is made to break right after the worker's last chunk.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from chaos_support import collect, text_request
from support import wait_until
from vllm_fleet.client import ClientPool
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig

pytestmark = pytest.mark.timeout(120)


async def test_a_stream_broken_after_its_last_chunk_is_a_whole_answer(workers):
    pool = await workers(2, mock_tokens_per_s=500, mock_ttft_ms=2)
    config = RouterConfig(policy="round_robin", retry_budget_min_per_s=100)
    clients = ClientPool()
    broken = False

    def connect(address: str):
        client = clients.get(address)
        return DiesAfterLastChunk(client, address) if broken else client

    registry = StaticRegistry.from_spec(",".join(w.address for w in pool))
    try:
        async with Router(registry, config, clients, metrics_registry=CollectorRegistry(), connect=connect) as router:
            await wait_until(lambda: sum(v.state == "serving" for v in router.snapshot()) == 2, timeout=20,
                             message="both workers serving")
            reference = await collect(router.stream(text_request("reference", "last words", 12)))
            broken = True
            stream = router.stream(text_request("broken", "last words", 12))
            text, finish = await collect(stream)
    finally:
        await clients.close()
    assert (text, finish) == reference
    assert stream.attempts == 1, "a finished request was sent again"


class DiesAfterLastChunk:
    """A worker's client whose stream breaks right after the worker's last chunk."""

    def __init__(self, client, address: str) -> None:
        self.client = client
        self.address = address

    async def generate(self, request, **options):
        async for chunk in self.client.generate(request, **options):
            yield chunk
        raise WorkerUnavailableError(f"worker {self.address} unavailable: Socket closed", worker=self.address)
