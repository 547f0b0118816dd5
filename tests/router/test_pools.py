"""Class pools: short requests go to the short pool's workers, long ones to the long pool's.

Workers name their pool themselves (`vllm-fleet worker --pool short`, reported in Info); the
registry records here carry no pool, so the router can only have learnt it from the workers.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from fakes import snapshot, view
from test_router_mock import Collected, consume, request, routed
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.router import AdmissionConfig
from vllm_fleet.router.features import LONG, SHORT, RequestFeatures, features_of
from vllm_fleet.router.policies import make_policy

LONG_MAX_TOKENS = 16  # a request asking for this many output tokens or more is 'long'


@pytest.fixture(scope="module")
async def pooled_workers(module_mock_workers):
    """Both tests only route through them (each counts its own requests): started once, together
    (a start is ~7 s of vLLM imports with this process idle)."""
    return list(await asyncio.gather(*(module_mock_workers.start(pool=pool, mock_tokens_per_s=2000, mock_ttft_ms=1)
                                       for pool in (SHORT, SHORT, LONG))))


async def test_short_requests_reach_only_the_short_pool_and_long_only_the_long(pooled_workers):
    short_a, short_b, long_worker = pooled_workers
    admission = AdmissionConfig(class_pools=True, long_max_tokens=LONG_MAX_TOKENS)
    async with routed(*(w.address for w in pooled_workers), admission=admission) as router:
        assert {v.address: v.pool for v in router.snapshot()} == {
            short_a.address: SHORT, short_b.address: SHORT, long_worker.address: LONG}
        served: dict[str, Counter] = {SHORT: Counter(), LONG: Counter()}
        for i in range(6):
            short = await consume(router, request(f"s{i}", "short one", 3), Collected())
            long = await consume(router, request(f"l{i}", "long one", LONG_MAX_TOKENS), Collected())
            served[SHORT][short.stream.worker] += 1
            served[LONG][long.stream.worker] += 1
            assert long.received == LONG_MAX_TOKENS
    assert set(served[SHORT]) <= {short_a.address, short_b.address} and sum(served[SHORT].values()) == 6
    assert set(served[LONG]) == {long_worker.address}


async def test_without_class_pools_every_worker_takes_both_classes(pooled_workers):
    async with routed(*(w.address for w in pooled_workers), policy="round_robin") as router:
        workers = {(await consume(router, request(f"l{i}", "long one", LONG_MAX_TOKENS), Collected())).stream.worker
                   for i in range(6)}
    assert workers == {w.address for w in pooled_workers}


def test_an_empty_pool_gets_nothing_unless_fallback_is_configured():
    only_short = snapshot(view("a:1", pool=SHORT), view("b:1", pool=SHORT))
    policy = make_policy("round_robin")
    assert policy.rank(RequestFeatures(model="m", pool=LONG), only_short) == []
    fallback = policy.rank(RequestFeatures(model="m", pool=LONG, pool_fallback=True), only_short)
    assert sorted(fallback) == ["a:1", "b:1"]


def test_fallback_never_overrides_a_pool_that_has_workers():
    mixed = snapshot(view("a:1", pool=SHORT), view("b:1", pool=LONG))
    ranked = make_policy("round_robin").rank(RequestFeatures(model="m", pool=LONG, pool_fallback=True), mixed)
    assert ranked == ["b:1"]


def test_fallback_is_only_asked_for_with_class_pools():
    req = build_request("r", [GenerateInput(text="hi")], SamplingParams(max_tokens=500))
    common = dict(model=None, prefix_chars=8, default_max_tokens=16, long_prompt_tokens=1000, long_max_tokens=100)
    assert features_of(req, **common, class_pools=True, class_pool_fallback=True).pool_fallback
    assert not features_of(req, **common, class_pools=False, class_pool_fallback=True).pool_fallback
