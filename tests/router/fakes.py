"""Test doubles for router unit tests: a steppable clock and hand-made snapshots."""

from __future__ import annotations

from vllm_fleet.protocol.types import WorkerLoad
from vllm_fleet.router.snapshot import PoolSnapshot, WorkerView


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
