"""Routing policies are pure functions: ranked on hand-made snapshots, no workers needed."""

from __future__ import annotations

from collections import Counter

import pytest

from fakes import addresses, snapshot, view
from vllm_fleet.errors import ConfigError
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import POLICIES, make_policy
from vllm_fleet.router.pool.snapshot import DOWN, DRAINING, EJECTED, OPEN


def features(ticket: int = 0, **kwargs) -> RequestFeatures:
    return RequestFeatures(model="m", ticket=ticket, **kwargs)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_ranks_only_eligible_workers(name):
    pool = snapshot(
        view("a:1"), view("b:1", state=DOWN), view("c:1", state=DRAINING), view("d:1", state=EJECTED),
        view("e:1", breaker=OPEN), view("f:1", model="other"), view("g:1", breaker="half_open"),
    )
    for ticket in range(5):
        ranked = make_policy(name).rank(features(ticket, session_key="s", prefix_key="p"), pool)
        assert sorted(ranked) == ["a:1", "g:1"]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_eligible_worker_gives_empty_ranking(name):
    assert make_policy(name).rank(features(), snapshot(view("a:1", state=DOWN))) == []


def test_pool_restriction_keeps_poolless_workers():
    pool = snapshot(view("a:1", pool="long"), view("b:1", pool="short"), view("c:1"))
    ranked = make_policy("round_robin").rank(RequestFeatures(model="m", pool="short"), pool)
    assert sorted(ranked) == ["b:1", "c:1"]


def test_least_outstanding_prefers_fewest_outstanding_tokens_then_worker_queue():
    pool = snapshot(view("a:1", outstanding=500), view("b:1", outstanding=100, running=9), view("c:1", outstanding=100))
    assert make_policy("least_outstanding").rank(features(), pool) == ["c:1", "b:1", "a:1"]


def test_least_outstanding_spreads_ties():
    pool = snapshot(*(view(a) for a in addresses(3)))
    firsts = {make_policy("least_outstanding").rank(features(t), pool)[0] for t in range(3)}
    assert len(firsts) == 3


def test_round_robin_cycles_through_all_workers():
    pool = snapshot(*(view(a) for a in addresses(3)))
    firsts = [make_policy("round_robin").rank(features(t), pool)[0] for t in range(6)]
    assert firsts[:3] == firsts[3:] and sorted(firsts[:3]) == addresses(3)


def test_power_of_two_never_picks_the_most_loaded_of_its_pair():
    loads = {a: i * 100 for i, a in enumerate(addresses(4))}
    pool = snapshot(*(view(a, outstanding=o) for a, o in loads.items()))
    policy = make_policy("power_of_two")
    firsts = Counter(policy.rank(features(t), pool)[0] for t in range(400))
    most_loaded = max(loads, key=loads.get)
    assert firsts[most_loaded] == 0
    assert firsts[addresses(4)[0]] > firsts[addresses(4)[2]]
    assert policy.rank(features(7), pool) == policy.rank(features(7), pool)  # pure: same ticket, same answer


def test_session_affinity_keeps_a_session_on_one_worker():
    pool = snapshot(*(view(a) for a in addresses(4)))
    policy = make_policy("session_affinity")
    chosen = {policy.rank(features(t, session_key="conv-42"), pool)[0] for t in range(20)}
    assert len(chosen) == 1


def test_session_affinity_spreads_sessions_over_workers():
    pool = snapshot(*(view(a) for a in addresses(4)))
    policy = make_policy("session_affinity")
    counts = Counter(policy.rank(features(session_key=f"s{i}"), pool)[0] for i in range(400))
    assert set(counts) == set(addresses(4))
    assert min(counts.values()) > 40  # 100 expected each; the ring's points keep it rough-even


def test_session_affinity_moves_few_sessions_when_a_worker_leaves():
    four = snapshot(*(view(a) for a in addresses(4)))
    three = snapshot(*(view(a) for a in addresses(3)))
    policy = make_policy("session_affinity")
    moved = 0
    for i in range(300):
        before = policy.rank(features(session_key=f"s{i}"), four)[0]
        after = policy.rank(features(session_key=f"s{i}"), three)[0]
        if before != addresses(4)[3]:
            moved += before != after
    assert moved == 0  # only the sessions of the worker that left move


def test_session_affinity_bounded_load_skips_an_overfull_worker():
    policy = make_policy("session_affinity", load_bound=1.25)
    idle = snapshot(*(view(a) for a in addresses(2)))
    home = policy.rank(features(session_key="hot"), idle)[0]
    other = next(a for a in addresses(2) if a != home)
    # Mean load with this request: (10 + 0 + 1) / 2 = 5.5; bound ceil(1.25 * 5.5) = 7 < 11.
    busy = snapshot(view(home, in_flight=10), view(other, in_flight=0))
    assert policy.rank(features(session_key="hot"), busy) == [other, home]
    # Within the bound (ceil(1.25 * 2 / 2) = 2) the session stays home though the other is idler.
    mild = snapshot(view(home, in_flight=1), view(other, in_flight=0))
    assert policy.rank(features(session_key="hot"), mild)[0] == home


def test_session_affinity_without_a_session_falls_back_to_least_outstanding():
    pool = snapshot(view("a:1", outstanding=900), view("b:1", outstanding=10))
    assert make_policy("session_affinity").rank(features(), pool)[0] == "b:1"


def test_prefix_affinity_groups_requests_by_prompt_prefix():
    pool = snapshot(*(view(a) for a in addresses(4)))
    policy = make_policy("prefix_affinity")
    same = {policy.rank(features(t, prefix_key="You are a helpful bot.", session_key=f"s{t}"), pool)[0]
            for t in range(20)}
    assert len(same) == 1
    spread = {policy.rank(features(prefix_key=f"system prompt {i}"), pool)[0] for i in range(50)}
    assert len(spread) > 1


def test_unknown_policy_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="least_outstanding"):
        make_policy("fastest")


def test_ring_first_is_the_first_of_the_ring_order():
    from vllm_fleet.router.policies import ring_first, ring_order

    for workers in (1, 2, 3, 8):
        pool = [f"10.0.0.{w}:50051" for w in range(workers)]
        for n in range(300):
            assert ring_first(f"key-{n}", pool) == ring_order(f"key-{n}", pool)[0]
