"""What a prompt's home is worth follows how much of the traffic repeats (router/prefix_reuse.py)."""

from __future__ import annotations

from fakes import addresses, snapshot, view
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import make_policy, ring_order
from vllm_fleet.router.prefix_reuse import PrefixReuse

A, B = addresses(2)


def test_a_fresh_router_keeps_its_homes_until_traffic_shows_nothing_repeats():
    reuse = PrefixReuse()
    assert reuse.share == 1.0
    reuse.add(0, 800)                      # one miss is not yet evidence
    assert reuse.share > 0.6
    for _ in range(9):                     # ten prompts of 800 tokens that nobody held
        reuse.add(0, 800)
    assert reuse.share < 0.2


def test_the_share_follows_a_change_of_traffic():
    reuse = PrefixReuse()
    for _ in range(200):                   # nothing repeats
        reuse.add(0, 1000)
    assert reuse.share < 0.02
    for _ in range(200):                   # then multi-turn chat: 90% of each prompt was held
        reuse.add(900, 1000)
    assert 0.85 < reuse.share <= 0.9
    reuse.add(5000, 1000)                  # more held than sent (a miscount) counts as all of it
    reuse.add(10, 0)                       # an empty prompt is no evidence
    assert reuse.share <= 1.0


def fresh(address: str, **kwargs):
    return view(address, kv_events_fresh=True, **kwargs)


def test_where_nothing_repeats_a_miss_goes_to_the_least_loaded_not_its_home():
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    # The home has 1,200 tokens more work ahead (300 weighted): the home's 512 outweighs that
    # while prompts repeat; where a fifth of what arrives was held it is worth ~100, and the
    # miss goes where it starts sooner.
    near = snapshot(fresh(home, outstanding=1200), fresh(other))
    miss = dict(model="m", prompt_tokens=2000, max_tokens=100, frontier_key="101")
    assert make_policy("cache_aware").rank(RequestFeatures(**miss, prefix_reuse=1.0), near)[0] == home
    assert make_policy("cache_aware").rank(RequestFeatures(**miss, prefix_reuse=0.2), near)[0] == other
    # Between equally loaded workers the home still decides, however little repeats.
    even = snapshot(fresh(home), fresh(other))
    for ticket in range(4):
        assert make_policy("cache_aware").rank(RequestFeatures(**miss, prefix_reuse=0.05, ticket=ticket), even)[0] == home
