"""Cache-aware routing: the prefill a worker would save against its load, ranked on hand-made views."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from fakes import addresses, snapshot, view
from vllm_fleet.router import RouterConfig, add_router_options, router_config_from_args
from vllm_fleet.router.cache.tuning import CacheTuning
from vllm_fleet.router.cache.index import CacheIndex
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import CacheAware, CacheCosts, Policy, make_policy, ring_order
from vllm_fleet.router.pool.snapshot import PoolSnapshot

A, B, C = addresses(3)


class Prompt(NamedTuple):
    """A request as the policy sees it: its features, and what the cache index answered for it."""

    features: RequestFeatures
    cache: CacheMatch


def prompt(cached: dict[str, int], prompt_tokens: int = 2000, ticket: int = 0, frontier_key: str = "") -> Prompt:
    """A prompt of `prompt_tokens` of which each worker in `cached` holds that many leading tokens;
    `frontier_key`: the first block nobody holds ("" = none)."""
    return Prompt(RequestFeatures(model="m", prompt_tokens=prompt_tokens, max_tokens=100, ticket=ticket),
                  CacheMatch(cached_tokens=cached, frontier_key=frontier_key))


def ranked(policy: Policy, asked: Prompt, pool: PoolSnapshot) -> list[str]:
    """`policy`'s ranking of `pool` for the prompt, given what the cache index answered for it."""
    return policy.rank(asked.features, pool, asked.cache)


def fresh(address: str, **kwargs):
    return view(address, kv_events_fresh=True, **kwargs)


def test_prefers_the_worker_holding_the_longest_prefix():
    pool = snapshot(fresh(A), fresh(B), fresh(C))
    for ticket in range(3):
        assert ranked(make_policy("cache_aware"), prompt({A: 512, B: 1536, C: 1024}, ticket=ticket), pool) == [B, C, A]


def test_saved_prefill_is_weighed_against_load():
    pool = snapshot(fresh(A, outstanding=3000), fresh(B, outstanding=0))
    # A saves 1,500 prompt tokens but has 3,000 tokens of work ahead: B is cheaper (no copy cost).
    no_copy = CacheAware(CacheCosts(load_weight=1.0, copy_weight=0))
    assert ranked(no_copy, prompt({A: 1500}), pool) == [B, A]
    # Prefill weighed 3x: A's saving now outweighs its load.
    heavy_prefill = CacheAware(CacheCosts(prefill_weight=3.0, load_weight=1.0, load_bound=None, copy_weight=0))
    assert ranked(heavy_prefill, prompt({A: 1500}), pool) == [A, B]


def test_copying_what_another_worker_holds_costs_its_cache_room_too():
    # A holds 2,000 of the prompt's 2,100 tokens and has one miss's prefill (2,200 tokens) more
    # to do than B. By prefill alone B is cheaper (2,100 + 0 < 100 + 2,200), and B would copy the
    # prefix into its cache, evicting another: the copy term keeps the hit on its holder.
    pool = snapshot(fresh(A, outstanding=2200), fresh(B, outstanding=0))
    hit = prompt({A: 2000}, prompt_tokens=2100)
    assert ranked(CacheAware(CacheCosts(load_weight=1.0, copy_weight=0, load_bound=None)), hit, pool) == [B, A]
    assert ranked(CacheAware(CacheCosts(load_weight=1.0, load_bound=None)), hit, pool) == [A, B]
    # A load difference worth more than two prefills of the shared part still moves it.
    far = snapshot(fresh(A, outstanding=4300), fresh(B, outstanding=0))
    assert ranked(CacheAware(CacheCosts(load_weight=1.0, load_bound=None)), hit, far) == [B, A]
    # The default: the copy term on.
    assert ranked(make_policy("cache_aware"), hit, pool)[0] == A


def test_when_every_worker_queues_a_hit_stays_on_its_holder_a_few_requests_behind():
    # Both workers deep in work (the H200 at 64/s); A holds 2,000 of the prompt's 2,100 tokens and
    # is two prefills behind B. Counting load as prefill (1.0), B wins and copies the prefix; at
    # the default quarter the hit stays where the prefix is, which saved the pair's throughput.
    pool = snapshot(fresh(A, outstanding=7500), fresh(B, outstanding=3000))
    hit = prompt({A: 2000}, prompt_tokens=2100)
    assert ranked(CacheAware(CacheCosts(load_weight=1.0)), hit, pool)[0] == B
    assert ranked(make_policy("cache_aware"), hit, pool)[0] == A


def test_others_queued_sequences_count_as_load():
    pool = snapshot(fresh(A, running=8), fresh(B))     # A runs 8 sequences of other routers
    assert ranked(make_policy("cache_aware"), prompt({A: 200}), pool) == [B, A]


def test_bounded_load_moves_a_hot_prefix_off_an_overloaded_worker():
    # A holds the whole hot prompt and its cost is still lowest (prefill saved > its load),
    # but its load is far above the mean: the guard ranks it last.
    pool = snapshot(fresh(A, outstanding=1800), fresh(B, outstanding=100), fresh(C, outstanding=0))
    hot = prompt({A: 2000, B: 0, C: 0})
    unbounded = CacheAware(CacheCosts(load_bound=None))
    assert ranked(unbounded, hot, pool)[0] == A
    assert ranked(make_policy("cache_aware"), hot, pool) == [C, B, A]
    # Within the bound the cache hit keeps winning.
    near = snapshot(fresh(A, outstanding=500), fresh(B, outstanding=400), fresh(C, outstanding=300))
    assert ranked(make_policy("cache_aware"), hot, near)[0] == A


def test_stale_worker_is_scored_by_load_alone():
    pool = snapshot(view(A, outstanding=100), fresh(B, outstanding=500))    # A's events are stale
    assert ranked(make_policy("cache_aware"), prompt({A: 2000, B: 1000}), pool) == [B, A]
    pool = snapshot(fresh(A, outstanding=100), fresh(B, outstanding=500))
    assert ranked(make_policy("cache_aware"), prompt({A: 2000, B: 1000}), pool) == [A, B]


def test_no_shared_prefix_orders_like_least_outstanding():
    pool = snapshot(fresh(A, outstanding=700), fresh(B, outstanding=100), fresh(C, outstanding=300))
    for ticket in range(3):
        order = ranked(make_policy("cache_aware"), prompt({}, ticket=ticket), pool)
        assert order == ranked(make_policy("least_outstanding"), prompt({}, ticket=ticket), pool) == [B, C, A]
        # A request the cache index was not asked about (its ids not known) ranks as one nobody holds.
        assert make_policy("cache_aware").rank(prompt({}, ticket=ticket).features, pool) == order


def test_ties_rotate_by_ticket():
    pool = snapshot(fresh(A), fresh(B), fresh(C))
    firsts = {ranked(make_policy("cache_aware"), prompt({}, ticket=t), pool)[0] for t in range(3)}
    assert firsts == {A, B, C}


def test_a_prefix_held_nowhere_goes_to_its_home_whatever_the_ticket():
    # Equal loads, nobody holds the prompt: every ticket sends it to one worker, its frontier's
    # home on the ring, so the next request of that prefix finds it there (not a copy on each).
    pool = snapshot(fresh(A), fresh(B), fresh(C))
    homes = {}
    for frontier in ("101", "202", "303", "404", "505", "606"):
        firsts = {ranked(make_policy("cache_aware"), prompt({}, ticket=t, frontier_key=frontier), pool)[0]
                  for t in range(6)}
        assert firsts == {ring_order(frontier, [A, B, C])[0]}
        homes[frontier] = firsts.pop()
    assert len(set(homes.values())) > 1   # different prefixes, different homes: the caches split them
    # Without a home (0 tokens) the ticket's rotation decides, as before.
    no_home = CacheAware(CacheCosts(home_tokens=0))
    assert {ranked(no_home, prompt({}, ticket=t, frontier_key="101"), pool)[0] for t in range(3)} == {A, B, C}


def test_the_home_yields_to_a_cache_hit_and_to_a_real_load_difference():
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    pool = snapshot(fresh(A), fresh(B))
    # The other worker holds 1,024 tokens of the prompt: saved prefill beats the home.
    assert ranked(make_policy("cache_aware"), prompt({other: 1024}, frontier_key="101"), pool)[0] == other
    # The home has 3,000 more tokens of work ahead (750 at the default load weight of a quarter,
    # more than the home's 512): the other takes the miss.
    busy_home = snapshot(fresh(home, outstanding=3000), fresh(other))
    assert ranked(make_policy("cache_aware"), prompt({}, frontier_key="101"), busy_home)[0] == other
    # ... but 1,200 more only (300 weighted): the home keeps it.
    near = snapshot(fresh(home, outstanding=1200), fresh(other))
    assert ranked(make_policy("cache_aware"), prompt({}, frontier_key="101"), near)[0] == home
    # A short prompt's home is worth only what it would cache there: 100 tokens, less than 300.
    assert ranked(make_policy("cache_aware"), prompt({}, prompt_tokens=100, frontier_key="101"), near)[0] == other


def test_a_prompt_that_is_mostly_its_held_prefix_stays_with_the_holder():
    # The other worker holds 1,900 of the prompt's 2,000 tokens; the frontier (in the last 100
    # new ones) hashes to `home`. The new part is smaller than the holder's lead: the holder wins,
    # and the home, which would copy the prefix, pays for that copy.
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    pool = snapshot(fresh(A), fresh(B))
    assert ranked(make_policy("cache_aware"), prompt({other: 1900}, frontier_key="101"), pool)[0] == other


def test_a_prompt_that_is_mostly_new_goes_to_its_home_though_another_holds_its_start():
    # Workload (b)'s shape: one system text every request starts with (256 tokens, held by the
    # worker that served the first request), then a tenant's new document (1,744 tokens nobody
    # holds). Where the document is cached is what matters: its frontier's home gets it, so the
    # tenants spread over the workers instead of all piling onto the first one.
    pool = snapshot(fresh(A), fresh(B))
    for frontier in ("101", "202", "303", "404", "505", "606"):
        home = ring_order(frontier, [A, B])[0]
        other = B if home == A else A
        firsts = {ranked(make_policy("cache_aware"), prompt({other: 256}, ticket=t, frontier_key=frontier), pool)[0]
                  for t in range(4)}
        assert firsts == {home}
    # The holder of the common start keeps the prompt when it is the home, and with no home
    # (home_tokens 0) its saved prefill decides as before.
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    assert ranked(make_policy("cache_aware"), prompt({home: 256}, frontier_key="101"), pool)[0] == home
    no_home = CacheAware(CacheCosts(home_tokens=0))
    assert ranked(no_home, prompt({other: 256}, frontier_key="101"), pool)[0] == other
    # A real load difference on the home still moves the new document to the holder.
    busy_home = snapshot(fresh(home, outstanding=3000), fresh(other))
    assert ranked(make_policy("cache_aware"), prompt({other: 256}, frontier_key="101"), busy_home)[0] == other


def test_the_three_knobs_are_router_options():
    parser = argparse.ArgumentParser()
    add_router_options(parser)
    config = router_config_from_args(parser.parse_args([
        "--policy", "cache_aware", "--cache-load-weight", "0.5", "--cache-index-max-entries", "1000",
        "--cache-home-tokens", "128"]))
    assert config.policy == "cache_aware"
    assert (config.cache_load_weight, config.cache_index_max_entries, config.cache_home_tokens) == (0.5, 1000, 128)
    assert config.cache_tuning == CacheTuning()  # the internal constants keep their measured defaults


def ring_home_and_other() -> tuple[str, str, Prompt]:
    """The ring's home of frontier "101" between A and B, the other worker, and a prompt no one holds."""
    home = ring_order("101", [A, B])[0]
    return home, B if home == A else A, prompt({}, frontier_key="101")


def test_a_new_prefix_goes_to_the_emptier_cache_when_its_ring_home_is_fuller():
    home, other, new = ring_home_and_other()
    full_home = snapshot(fresh(home, cache_blocks=1000, kv_blocks=1600), fresh(other, cache_blocks=100, kv_blocks=1600))
    assert ranked(make_policy("cache_aware"), new, full_home)[0] == other
    # Within 1.1x of the mean fill the ring decides, so routers seeing the same events agree.
    even = snapshot(fresh(home, cache_blocks=1600, kv_blocks=1600), fresh(other, cache_blocks=1500, kv_blocks=1600))
    assert ranked(make_policy("cache_aware"), new, even)[0] == home
    # Off (null), or a worker whose events are stale (its blocks unknown): the ring alone.
    assert ranked(CacheAware(CacheCosts(home_balance=None)), new, full_home)[0] == home
    stale = snapshot(view(home, cache_blocks=1000, kv_blocks=1600), fresh(other, cache_blocks=100, kv_blocks=1600))
    assert ranked(make_policy("cache_aware"), new, stale)[0] == home


def test_fill_is_a_share_of_each_workers_cache_when_every_worker_says_its_size():
    # A MIG slice's 800 blocks hold fewer prefixes than a GPU's 1,600: 700 of 1,600 is the emptier.
    home, other, new = ring_home_and_other()
    sized = snapshot(fresh(home, cache_blocks=700, kv_blocks=1600), fresh(other, cache_blocks=500, kv_blocks=800))
    assert ranked(make_policy("cache_aware"), new, sized)[0] == home
    unsized = snapshot(fresh(home, cache_blocks=700), fresh(other, cache_blocks=500, kv_blocks=800))
    assert ranked(make_policy("cache_aware"), new, unsized)[0] == other   # blocks counted as they are


def test_tenants_arriving_one_after_another_split_evenly_over_two_caches():
    # 24 tenant documents (~1,900 tokens, 119 blocks each) routed as they first arrive, each
    # noted in the index at once as the router does. These keys' ring homes split 6/18: a worker
    # of 1,600 blocks given 18 documents (2,142 blocks) evicts them in turn while the other has room.
    index = CacheIndex()

    def first_arrivals(policy: CacheAware) -> dict[str, int]:
        placed = {A: 0, B: 0}
        for tenant in range(24):
            pool = snapshot(*(fresh(w, cache_blocks=index.entries_of(w), kv_blocks=1600) for w in (A, B)))
            chosen = ranked(policy, prompt({}, prompt_tokens=1900, frontier_key=f"tenant-13-{tenant}"), pool)[0]
            index.note_routed(chosen, "m", [hash((policy.costs.home_balance, tenant, block)) for block in range(119)])
            placed[chosen] += 1
        return placed

    assert sorted(first_arrivals(CacheAware(CacheCosts(home_balance=None))).values()) == [6, 18]
    index = CacheIndex()
    balanced = first_arrivals(make_policy("cache_aware"))
    assert abs(balanced[A] - balanced[B]) <= 2, balanced


def test_home_balance_is_an_internal_constant():
    assert RouterConfig().cache_tuning.home_balance == 1.1
    assert RouterConfig(cache_tuning=CacheTuning(home_balance=None)).cache_tuning.home_balance is None
