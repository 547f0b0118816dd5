"""Adapter-aware placement (router/adapters.py) with fake workers: holders first, one load per
burst, the least-loaded worker with a free slot, else the least-loaded full one (which evicts)."""

from __future__ import annotations

import asyncio

import pytest

from fakes import FakeClock, snapshot
from support import wait_until
from vllm_fleet.errors import InvalidRequestError, NoWorkerError, UnknownModelError, WorkerOverloadedError
from vllm_fleet.protocol.types import Adapter, WorkerLoad
from vllm_fleet.router.adapters import AdapterPlacement
from vllm_fleet.router.pool.snapshot import WorkerView


class FakeWorker:
    """A worker's adapter RPCs: holds names in LRU order, evicts the oldest when full."""

    def __init__(self, address: str, *, slots: int = 2, held: tuple[str, ...] = (), running: int = 0) -> None:
        self.address = address
        self.slots = slots
        self.held = list(held)
        self.running = running
        self.loads: list[str] = []
        self.gate: asyncio.Event | None = None
        self.waiting_loads = 0  # loads held at the gate
        self.refuse: Exception | None = None

    def view(self) -> WorkerView:
        load = WorkerLoad(running=self.running, adapters=list(self.held), max_adapters=self.slots)
        return WorkerView(address=self.address, model="m", load=load)

    async def load_adapter(self, name: str, path: str):
        self.loads.append(name)
        if self.gate is not None:
            self.waiting_loads += 1
            await self.gate.wait()
        if self.refuse is not None:
            raise self.refuse
        if name not in self.held:
            if len(self.held) >= self.slots:
                self.held.pop(0)
            self.held.append(name)
        return [Adapter(n, f"/a/{n}", 8, "m") for n in self.held], self.slots

    async def unload_adapter(self, name: str):
        self.held.remove(name)
        return [Adapter(n, f"/a/{n}", 8, "m") for n in self.held], self.slots

    async def list_adapters(self):
        return [Adapter(n, f"/a/{n}", 8, "m") for n in self.held], self.slots


def placement(*workers: FakeWorker, clock=None) -> AdapterPlacement:
    by_address = {w.address: w for w in workers}
    return AdapterPlacement(lambda: snapshot(*(w.view() for w in workers)), by_address.__getitem__,
                            clock=clock or FakeClock())


async def test_holders_come_first_in_the_policy_order():
    a, b, c = FakeWorker("a"), FakeWorker("b", held=("sql",)), FakeWorker("c", held=("sql",))
    place = placement(a, b, c)
    await place.place("sql", "m")
    assert place.loads == 0  # held already: nothing to load
    assert place.prefer_holders("sql", ["c", "a", "b"], snapshot(a.view(), b.view(), c.view())) == ["c", "b"]
    assert place.base_of("sql") == "m" and place.base_of("nope") is None


async def test_a_burst_for_an_unloaded_adapter_loads_it_once():
    a, b = FakeWorker("a", running=3), FakeWorker("b", running=1)
    place = placement(a, b)
    place.remember("sql", "/a/sql", "m")  # in the catalog, loaded nowhere
    b.gate = asyncio.Event()
    burst = [asyncio.create_task(place.place("sql", "m")) for _ in range(32)]
    # Release the load only once it is in flight, with all 32 requests waiting on it.
    await wait_until(lambda: b.waiting_loads == 1, timeout=10, message="the adapter load in flight")
    b.gate.set()
    await asyncio.gather(*burst)
    assert (a.loads, b.loads) == ([], ["sql"])


async def test_free_slot_beats_lower_load_and_full_workers_evict_their_lru():
    clock = FakeClock()
    busy_free = FakeWorker("a", running=5, held=("x",))
    idle_full = FakeWorker("b", running=0, held=("x", "y"))
    place = placement(busy_free, idle_full, clock=clock)
    assert await place.load_on("sql", "/a/sql", "m") == "a"  # a has a free slot
    clock.advance(60)  # what we noted expires: Load answers again
    # Now every worker is full: the least loaded one takes it and evicts its least recently used.
    assert await place.load_on("more", "/a/more", "m") == "b"
    assert idle_full.held == ["y", "more"]


async def test_refusals_move_on_or_stop_with_the_right_error():
    a, b = FakeWorker("a", running=0), FakeWorker("b", running=9)
    place = placement(a, b)
    a.refuse = WorkerOverloadedError("all slots busy")  # every adapter on a runs requests
    assert await place.load_on("sql", "/a/sql", "m") == "b"
    a.refuse = b.refuse = InvalidRequestError("rank 64 above 8", param="rank")
    with pytest.raises(InvalidRequestError) as bad:
        await place.register("big", "/a/big", "m")
    assert bad.value.param == "rank" and "big" not in place.catalog()
    with pytest.raises(UnknownModelError):
        await place.place("never-registered", "m")
    with pytest.raises(NoWorkerError):
        await placement(FakeWorker("c", slots=0)).load_on("sql", "/a/sql", "m")


async def test_a_refused_request_forgets_the_holder_until_load_says_otherwise():
    clock = FakeClock()
    a = FakeWorker("a", held=("sql",))
    place = placement(a, clock=clock)
    place.forget("a", "sql")
    assert place.prefer_holders("sql", ["a"], snapshot(a.view())) == []
    clock.advance(60)
    assert place.prefer_holders("sql", ["a"], snapshot(a.view())) == ["a"]


async def test_an_adapter_only_a_worker_reported_is_placed_elsewhere_once_that_worker_leaves():
    holder, other = FakeWorker("a", held=("static",)), FakeWorker("b")
    workers = [holder, other]
    place = AdapterPlacement(lambda: snapshot(*(w.view() for w in workers)), {"a": holder, "b": other}.__getitem__,
                             clock=FakeClock())
    assert place.base_of("static") == "m"  # seen in a's Load; its path is asked of a
    await wait_until(lambda: place.catalog()["static"].path == "/a/static", timeout=5, message="the path")
    workers.remove(holder)  # a leaves the pool
    await place.place("static", "m")
    assert other.loads == ["static"]
