"""Test doubles for router unit tests: a steppable clock, hand-made snapshots, and a scripted
worker client behind a one-worker Pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.client.loads import LoadFeed
from vllm_fleet.errors import WorkerUnavailableError
from vllm_fleet.protocol.types import REQUEST_FORM, WorkerInfo, WorkerLoad
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.pool.membership import Pool
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def view(address: str, *, model: str = "m", in_flight: int = 0, outstanding: int = 0, running: int = 0,
         **kwargs) -> WorkerView:
    return WorkerView(address=address, model=model, in_flight=in_flight, outstanding_tokens=outstanding,
                      load=WorkerLoad(running=running), **kwargs)


def snapshot(*views: WorkerView) -> PoolSnapshot:
    return PoolSnapshot(tuple(views))


def addresses(count: int) -> list[str]:
    return [f"10.0.0.{i}:50051" for i in range(1, count + 1)]


class ScriptedWorkerClient:
    """A worker client whose answers the test sets, counting the calls made to it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.status = "SERVING"                   # what the health service answers
        self.answer = WorkerLoad()                # what a Load call answers
        self.load_fails = False                   # Load calls get no answer
        self.streaming: WorkerLoad | None = None  # a Load a stream call brings every turn
        self.pushing: WorkerLoad | None = None    # a Load the worker pushes on its stream call
        self.push_stalled = False                 # it says it pushes, but no push comes
        self.push_asked_every: float | None = None
        self.request_form = REQUEST_FORM          # what its Info says it reads (0: a 0.1 worker)
        self.info_calls = 0
        self.push_waits = 0                       # waits for a push begun
        self.pushes_late = 0                      # ... that ran out
        self.health_calls = 0
        self.load_calls = 0

    async def health(self, timeout: float) -> str:
        self.health_calls += 1
        return self.status

    async def load(self, timeout: float) -> WorkerLoad:
        self.load_calls += 1
        if self.load_fails:
            raise WorkerUnavailableError("no answer", worker=self.address)
        return self.answer

    async def info(self, timeout: float) -> WorkerInfo:
        self.info_calls += 1
        return WorkerInfo(model="m", max_model_len=2048, engine="mock", request_form=self.request_form)

    def take_streamed_load(self) -> WorkerLoad | None:
        return self.streaming

    def pushes_load(self, every_s: float) -> bool:
        self.push_asked_every = every_s
        return self.pushing is not None or self.push_stalled

    async def next_pushed_load(self, timeout: float) -> WorkerLoad | None:
        self.push_waits += 1
        if self.push_stalled:
            await asyncio.sleep(timeout)
            self.pushes_late += 1
            return None
        await asyncio.sleep(timeout / 4)  # the worker's pace: a push well within the timeout
        return self.pushing

    def loads(self, every_s: float, *, health_every_s: float,
              check: asyncio.Event | None = None) -> AsyncIterator[WorkerLoad]:
        """The shipped rule (client/loads.py) over these scripted routes, as WorkerClient has it."""
        return LoadFeed(self, every_s, health_every_s=health_every_s, check=check).loads()

    def get(self, address: str) -> ScriptedWorkerClient:  # the ClientPool the Pool asks
        return self


POOL_WORKER = "10.0.0.1:50051"


async def serving_pool(worker: ScriptedWorkerClient, clock: FakeClock, poll_s: float) -> Pool:
    """A started Pool of that one worker, polling every `poll_s`, once it took the worker as serving."""
    pool = Pool(StaticRegistry.from_spec(worker.address), worker,
                RouterConfig(health_poll_interval_s=poll_s, load_poll_interval_s=poll_s),
                RouterMetrics(CollectorRegistry()), clock=clock)
    await pool.start()
    await wait_until(lambda: pool.worker(worker.address) is not None
                     and pool.worker(worker.address).health == "SERVING", timeout=5, message="the worker serving")
    return pool


@asynccontextmanager
async def started_router(addresses: list[str], config: RouterConfig) -> AsyncIterator[Router]:
    """A Router over these workers, with its own metrics registry, once it is ready."""
    router = Router(StaticRegistry([WorkerRecord(address=a) for a in addresses]), config,
                    metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await router.wait_ready(timeout=60)
        yield router
    finally:
        await router.close()


async def send_token_ids(router: Router, rid: str, token_ids: list[int], *,
                         model: str | None = None) -> tuple[str, int]:
    """Streams a 2-token answer to `token_ids` on a worker of `model` (None: the only one):
    (the worker that answered, its cached prompt tokens)."""
    from vllm_fleet.protocol import GenerateInput, SamplingParams
    from vllm_fleet.protocol.sampling import build_request

    request = build_request(rid, [GenerateInput(token_ids=token_ids)], SamplingParams(max_tokens=2, temperature=0))
    async with router.stream(request, model=model) as stream:
        usage = [c.usage async for c in stream if c.usage is not None]
        return stream.worker, usage[-1].cached_tokens
