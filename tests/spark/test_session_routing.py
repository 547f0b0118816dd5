"""Where a session's turns go, without Spark: the same worker from every executor process.

Each executor process has its own Router, so the choice must not depend on anything local to
one of them: not on its in-flight counts (the old load bound did), and not on one health
check that came back late (a CPU-starved worker looked down for a moment, and its sessions
moved). It may only change when the worker really stops serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.client.loads import LoadFeed
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.policies import make_policy, ring_order
from vllm_fleet.router.pool.membership import Pool
from vllm_fleet.router.pool.snapshot import DOWN, SERVING, PoolSnapshot, WorkerView
from vllm_fleet.spark.config import SparkGenerateConfig

WORKERS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]


def session_policy():
    config = SparkGenerateConfig(workers=WORKERS, prompt_col="text", session_col="chat", turn_col="turn")
    router = config.router_config()
    return make_policy(router.policy, load_bound=router.affinity_load_bound)


def pool(in_flight: dict[str, int], down: tuple[str, ...] = ()) -> PoolSnapshot:
    return PoolSnapshot(tuple(WorkerView(address=a, model="m", in_flight=in_flight.get(a, 0),
                                         state=DOWN if a in down else SERVING) for a in WORKERS))


def test_a_session_goes_to_the_same_worker_whatever_this_process_has_in_flight():
    policy = session_policy()
    loads = [{}, {WORKERS[0]: 9}, {WORKERS[1]: 9, WORKERS[2]: 1}, {a: i * 5 for i, a in enumerate(WORKERS)}]
    for s in range(50):
        session = RequestFeatures(model="m", session_key=f"s{s}")
        homes = {policy.rank(session, pool(load))[0] for load in loads}
        assert homes == {ring_order(f"s{s}", WORKERS)[0]}


def test_a_session_moves_only_while_its_worker_is_down_and_comes_back():
    policy = session_policy()
    session = RequestFeatures(model="m", session_key="chat-7")
    home, second, _ = ring_order("chat-7", WORKERS)
    assert policy.rank(session, pool({}, down=(home,)))[0] == second
    assert policy.rank(session, pool({}))[0] == home


class ScriptedClient:
    """Answers health from a script (then SERVING), noting the worker's state at each check."""

    def __init__(self, address: str, pool: list) -> None:
        self.address = address
        self.script: list[str] = []
        self.states: list[str] = []   # the router's view of this worker when each check began
        self._pool = pool

    async def health(self, *, timeout: float) -> str:
        view = self._pool[0].snapshot().get(self.address) if self._pool else None
        self.states.append(view.state if view else "")
        return self.script.pop(0) if self.script else "SERVING"

    async def info(self, *, timeout: float) -> WorkerInfo:
        return WorkerInfo(model="m", max_model_len=4096, engine="scripted")

    async def load(self, *, timeout: float) -> WorkerLoad:
        return WorkerLoad()  # no health in it, as from a worker that predates the field

    def pushes_load(self, every_s: float) -> bool:
        return False  # it predates pushes: its health comes from the health checks scripted above

    async def next_pushed_load(self, timeout: float) -> WorkerLoad | None:
        return None

    def take_streamed_load(self) -> WorkerLoad | None:
        return None

    def loads(self, every_s: float, *, health_every_s: float,
              check: asyncio.Event | None = None) -> AsyncIterator[WorkerLoad]:
        return LoadFeed(self, every_s, health_every_s=health_every_s, check=check).loads()


class ScriptedClients:
    def __init__(self) -> None:
        self.clients: dict[str, ScriptedClient] = {}
        self.pool: list[Pool] = []

    def get(self, address: str) -> ScriptedClient:
        return self.clients.setdefault(address, ScriptedClient(address, self.pool))

    async def close(self) -> None:
        pass


async def test_one_late_health_answer_does_not_take_a_worker_out_of_rotation():
    clients = ScriptedClients()
    config = SparkGenerateConfig(workers=WORKERS[:2], prompt_col="text", session_col="chat", turn_col="turn")
    # The router's worker pool on its own: the test reports a failed request to it directly.
    worker_pool = Pool(StaticRegistry.from_spec(WORKERS[:2]), clients, config.router_config().model_copy(
        update={"health_poll_interval_s": 0.05}), RouterMetrics.for_registry(CollectorRegistry()))
    clients.pool.append(worker_pool)
    await worker_pool.start()
    try:
        await wait_until(lambda: len(worker_pool.snapshot().eligible()) == 2, timeout=10, message="both serving")
        starved, dead = (clients.get(a) for a in WORKERS[:2])

        # One miss, then an answer: the worker never leaves rotation.
        seen = len(starved.states)
        starved.script = ["UNREACHABLE", "SERVING"]
        await wait_until(lambda: len(starved.states) >= seen + 4, timeout=10, message="starved worker re-checked")
        assert set(starved.states[seen:]) == {SERVING}

        # Two misses in a row: down.
        seen = len(dead.states)
        dead.script = ["UNREACHABLE"] * 2
        await wait_until(lambda: DOWN in dead.states[seen:], timeout=10, message="dead worker down")
        assert dead.states[seen:seen + 2] == [SERVING, SERVING]
        await wait_until(lambda: worker_pool.snapshot().get(dead.address).state == SERVING, timeout=10, message="back")

        # After a failed request, one miss is enough.
        seen = len(starved.states)
        starved.script = ["UNREACHABLE", "SERVING"]
        worker_pool.report(starved.address, ok=False)
        await wait_until(lambda: len(starved.states) >= seen + 2, timeout=10, message="starved worker re-checked")
        assert starved.states[seen + 1] == DOWN
    finally:
        await worker_pool.close()
