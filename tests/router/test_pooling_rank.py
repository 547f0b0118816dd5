"""rank_pooling: only workers that serve the endpoint, least loaded first, ties shared by the ticket."""

from __future__ import annotations

from vllm_fleet.protocol.types import WorkerLoad
from vllm_fleet.router.pooling import rank_pooling
from vllm_fleet.router.pool.snapshot import WorkerView


def _view(address: str, in_flight: int = 0, running: int = 0) -> WorkerView:
    return WorkerView(address=address, model="m", in_flight=in_flight, load=WorkerLoad(running=running))


def test_only_workers_serving_the_endpoint_are_ranked():
    views = [_view("a"), _view("b"), _view("c")]
    assert sorted(rank_pooling(views, {"a", "c"}, ticket=0)) == ["a", "c"]
    assert rank_pooling(views, set(), ticket=0) == []


def test_least_loaded_first():
    views = [_view("a", in_flight=3), _view("b", in_flight=1), _view("c", in_flight=1, running=5)]
    assert rank_pooling(views, {"a", "b", "c"}, ticket=0) == ["b", "c", "a"]


def test_ties_rotate_with_the_ticket():
    views = [_view("a"), _view("b")]
    firsts = {rank_pooling(views, {"a", "b"}, ticket=t)[0] for t in range(4)}
    assert firsts == {"a", "b"}
