"""What a prompt's home is worth follows whether new prompts come back (router/cache/prefix_reuse.py)."""

from __future__ import annotations

import random

from fakes import addresses, snapshot, view
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.cache.tuning import CacheTuning
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import CacheAware, CacheCosts, make_policy, ring_order
from vllm_fleet.router.cache.prefix_reuse import WINDOW, PrefixReuse

A, B = addresses(2)


def test_prompts_that_never_come_back_take_the_homes_worth_away_once_judged():
    reuse = PrefixReuse()
    for key in range(WINDOW):             # new parts still waiting for a reuse are not judged yet
        reuse.note([], key, 650)
    assert reuse.share == 1.0
    for key in range(WINDOW, WINDOW + 10):
        reuse.note([], key, 650)
    assert reuse.share < 0.1


def test_a_job_whose_documents_come_back_keeps_its_homes_from_the_first_row():
    # Eight documents, twelve rows each, shuffled (the Spark test's shape): every document's first
    # row is new, the rest hold it. The share of arriving tokens found cached would be lowest
    # while the documents are placed; this stays near 1 throughout.
    rows = [d for d in range(8) for _ in range(12)]
    random.Random(5).shuffle(rows)
    reuse, seen, lowest = PrefixReuse(), set(), 1.0
    for d in rows:
        if d in seen:
            reuse.note([d], None, 20)         # the document held, a question of its own: not mostly new
        else:
            reuse.note([], d, 400)
            seen.add(d)
        lowest = min(lowest, reuse.share)
    assert lowest > 0.95


def test_the_window_grows_to_the_rhythm_of_a_job_that_interleaves_many_documents():
    # 50 documents, 12 rows each, shuffled, one executor's half: a document's next row comes up to
    # dozens of new documents later. A window of 8 would count most of them unused at first; it
    # grows to twice the longest gap seen, and the share stays high over the job.
    rows = [d for d in range(50) for _ in range(12)]
    random.Random(3).shuffle(rows)
    reuse, seen, shares = PrefixReuse(), set(), []
    for d in rows[::2]:
        shares.append(reuse.share)
        if d in seen:
            reuse.note([d], None, 20)
        else:
            reuse.note([], d, 400)
            seen.add(d)
    assert reuse.window > 2 * WINDOW
    assert sum(shares) / len(shares) > 0.9
    assert reuse.share > 0.95


def test_a_reuse_after_the_window_is_still_credited():
    reuse = PrefixReuse()
    for key in range(WINDOW + 4):         # the first four leave the window unused
        reuse.note([], key, 500)
    before = reuse.share
    reuse.note([0, 1, 2, 3], None, 10)    # then a prompt holds all four
    assert reuse.share > before + 0.3


def fresh(address: str, **kwargs):
    return view(address, kv_events_fresh=True, **kwargs)


def miss_goes_to(pool, *, reuse: float, ticket: int = 0) -> str:
    """Where cache_aware sends a 2,000-token prompt nobody holds (its frontier "101"), when `reuse`
    of the new prompts before it came back."""
    features = RequestFeatures(model="m", prompt_tokens=2000, max_tokens=100, ticket=ticket)
    return make_policy("cache_aware").rank(features, pool, CacheMatch(frontier_key="101", prefix_reuse=reuse))[0]


def test_where_nothing_comes_back_a_miss_goes_to_the_least_loaded_not_its_home():
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    # The home has 1,200 tokens more work ahead (300 weighted): its 512 outweighs that while new
    # prompts come back; where a fifth of them do it is worth ~100, and the miss goes where it
    # starts sooner.
    near = snapshot(fresh(home, outstanding=1200), fresh(other))
    assert miss_goes_to(near, reuse=1.0) == home
    assert miss_goes_to(near, reuse=0.2) == other
    # Between equally loaded workers the home still decides, however little comes back.
    even = snapshot(fresh(home), fresh(other))
    for ticket in range(4):
        assert miss_goes_to(even, reuse=0.05, ticket=ticket) == home


def test_the_full_home_is_an_internal_constant():
    assert RouterConfig().cache_tuning.home_by_reuse is True
    assert RouterConfig(cache_tuning=CacheTuning(home_by_reuse=False)).cache_tuning.home_by_reuse is False
    home = ring_order("101", [A, B])[0]
    other = B if home == A else A
    near = snapshot(fresh(home, outstanding=1200), fresh(other))
    miss = RequestFeatures(model="m", prompt_tokens=2000, max_tokens=100)
    rarely_back = CacheMatch(frontier_key="101", prefix_reuse=0.2)
    assert CacheAware(CacheCosts(home_by_reuse=False)).rank(miss, near, rarely_back)[0] == home
