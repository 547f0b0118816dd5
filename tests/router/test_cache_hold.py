"""A routed prompt counts as cached on its worker while its request prefills, however long that
takes, and for the event delay after its first token; an attempt that fails before its first
token stored nothing, so its note goes at once. Router over scripted workers that stream KV
events (a snapshot, then nothing: only the router's own notes say where a prompt went), each
request held before its first chunk until the test lets it go; the router's clock is the
test's, so the ttl passes without waiting for it."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from fakes import FakeClock, ScriptedWorkerClient, addresses
from support import wait_until
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.kv_events import KvEventBatch
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import REQUEST_FORM, Chunk, GenerateRequest, Usage, WorkerInfo
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.tuning import CacheTuning

BS = 16
TTL_S = 2.0
PROMPT = [4 + (i * 7) % 40 for i in range(24 * BS)] + [5, 6, 7, 8, 9, 10, 11, 12]   # 24 full blocks
HELD = 24 * BS


class PrefillingWorker(ScriptedWorkerClient):
    """Streams KV events (an empty snapshot) and holds each request before its first chunk until
    `let_go(request_id)`; a request named in `fail` then fails instead."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.arrived: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()
        self.first_sent: set[str] = set()

    def gate(self, request_id: str) -> asyncio.Event:
        return self.gates.setdefault(request_id, asyncio.Event())

    async def info(self, timeout: float) -> WorkerInfo:
        self.info_calls += 1
        return WorkerInfo(model="m", max_model_len=4096, engine="mock", request_form=REQUEST_FORM,
                          kv_events=True, kv_block_size=BS)

    async def kv_events(self, *, after_sequence: int = 0, epoch: str = ""):
        yield KvEventBatch("e1", 0, 0.0, (), snapshot=True, block_size=BS)
        await asyncio.Event().wait()

    async def tokenizer_files(self, folder, *, timeout: float):
        raise WorkerUnavailableError("no tokenizer here: the tests send token ids", worker=self.address)

    async def generate(self, request: GenerateRequest, *, timeout: float | None = None):
        rid = request.request_id
        self.arrived.append(rid)
        await self.gate(rid).wait()                       # prefilling (or queued in the engine)
        if rid in self.fail:
            raise WorkerUnavailableError(f"{self.address} failed {rid}", worker=self.address)
        yield Chunk(0, 0, "a", [20])
        self.first_sent.add(rid)
        await self.gate(rid + "/end").wait()              # decoding, until the test ends it
        yield Chunk(0, 0, "b", [21], finish_reason="length", usage=Usage(prompt_tokens=len(PROMPT),
                                                                          completion_tokens=2))


class Workers:
    """The ClientPool the router asks, and its `connect`."""

    def __init__(self, count: int) -> None:
        self.by_address = {a: PrefillingWorker(a) for a in addresses(count)}

    def get(self, address: str) -> PrefillingWorker:
        return self.by_address[address]

    def holding(self, rid: str) -> PrefillingWorker | None:
        return next((w for w in self.by_address.values() if rid in w.arrived), None)

    def let_go(self, rid: str, *, to_the_end: bool = False) -> None:
        for worker in self.by_address.values():
            worker.gate(rid).set()
            if to_the_end:
                worker.gate(rid + "/end").set()


@asynccontextmanager
async def routed(workers: Workers, clock: FakeClock):
    # A light load weight: a prefix held on a busy worker beats an idle one that would prefill it
    # all, as it does on a fleet whose every worker is busy.
    config = RouterConfig(policy="cache_aware", cache_load_weight=0.1,
                          cache_tuning=CacheTuning(speculative_ttl_s=TTL_S),
                          load_poll_interval_s=0.02, health_poll_interval_s=0.02,
                          first_chunk_timeout_s=60.0, stall_timeout_s=60.0)
    router = Router(StaticRegistry.from_spec(",".join(workers.by_address)), config, workers, clock=clock,
                    connect=workers.get, metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await wait_until(lambda: sum(w.kv_events_fresh for w in router.snapshot().eligible()) == len(workers.by_address),
                         timeout=10, message="every worker serving, its events followed")
        yield router
    finally:
        await router.close()


async def consume(router: Router, rid: str) -> str:
    request = build_request(rid, [GenerateInput(token_ids=PROMPT)], SamplingParams(max_tokens=2, temperature=0))
    async with router.stream(request) as stream:
        async for _ in stream:
            pass
        return stream.worker


async def arrives(workers: Workers, rid: str) -> PrefillingWorker:
    await wait_until(lambda: workers.holding(rid) is not None, timeout=10, message=f"{rid} sent to a worker")
    return workers.holding(rid)


def held(router: Router) -> dict[str, int]:
    return router._cache.index.matched_tokens("m", block_keys(PROMPT, BS))


async def test_a_prefix_follows_a_request_still_prefilling_past_the_ttl():
    workers, clock = Workers(2), FakeClock()
    async with routed(workers, clock) as router:
        first = asyncio.create_task(consume(router, "first"))
        home = await arrives(workers, "first")
        clock.advance(10 * TTL_S)                          # a long prefill: no first token yet
        second = asyncio.create_task(consume(router, "second"))
        assert await arrives(workers, "second") is home    # where the prefix will be, not the idle worker
        workers.let_go("first", to_the_end=True)
        workers.let_go("second", to_the_end=True)
        assert await first == home.address and await second == home.address


async def test_after_the_first_token_the_note_lasts_the_ttl():
    workers, clock = Workers(2), FakeClock()
    async with routed(workers, clock) as router:
        first = asyncio.create_task(consume(router, "first"))
        home = await arrives(workers, "first")
        clock.advance(10 * TTL_S)
        workers.let_go("first")                            # the first token: the ttl starts now
        # The worker is asked for its next chunk once the stream took the first: noted by then.
        await wait_until(lambda: "first" in home.first_sent, timeout=10, message="the first token taken")
        clock.advance(TTL_S * 0.9)
        assert held(router) == {home.address: HELD}        # the engine's events may still be on their way
        clock.advance(TTL_S * 0.2)
        assert held(router) == {}                          # they would have come by now: the note goes
        workers.let_go("first", to_the_end=True)
        await first


async def test_a_failed_attempt_drops_its_note_at_once():
    workers, clock = Workers(2), FakeClock()
    async with routed(workers, clock) as router:
        first = asyncio.create_task(consume(router, "first"))
        home = await arrives(workers, "first")
        home.fail.add("first")
        workers.let_go("first")                            # it fails before its first token
        other = await arrives(workers, "first-a2")         # the second attempt, on the other worker
        assert other is not home
        # No time passed: only the failed attempt's end took its note off the failed worker.
        assert held(router) == {other.address: HELD}
        assert router._cache.index.counters.speculative_dropped == 24
        workers.let_go("first-a2", to_the_end=True)
        assert await first == other.address
