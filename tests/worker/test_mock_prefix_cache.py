"""The mock engine's prefix cache: chained full blocks, cached leading blocks, LRU eviction, events."""

from __future__ import annotations

from vllm_fleet.protocol.kv_events import BlocksRemoved, BlocksStored
from vllm_fleet.worker.engines.mock_prefix_cache import MockPrefixCache
from vllm_fleet.worker.kv_relay import KvRelay


def test_leading_cached_blocks_count_but_the_last_prompt_token_is_always_computed():
    cache = MockPrefixCache(capacity=8, block_size=2)
    assert cache.admit([1, 2, 3, 4]) == 0
    assert cache.admit([1, 2, 3, 4]) == 2        # both blocks held; vLLM recomputes the last token
    assert cache.admit([1, 2, 3, 4, 5]) == 4
    assert cache.admit([1, 2, 9, 9, 9]) == 2     # the second block differs
    assert cache.admit([1, 2, 3, 4], lora_name="ad") == 0  # an adapter's blocks are its own
    assert (cache.queries, cache.hits) == (22, 8)


def test_eviction_is_least_recently_used_and_published_before_the_new_blocks():
    relay = KvRelay(2, 3)
    cache = MockPrefixCache(capacity=3, block_size=2, relay=relay)
    cache.admit([1, 2, 3, 4, 0])        # blocks a1 a2
    cache.admit([7, 8, 0])              # block b1
    assert cache.admit([1, 2, 0]) == 2  # a1 is used again: a2 is now the oldest
    cache.admit([5, 6, 0])              # evicts a2
    removed, stored = relay._ring[-1].events
    a1, a2 = cache.block_hashes([1, 2, 3, 4])
    assert isinstance(removed, BlocksRemoved) and removed.block_hashes == (a2,)
    assert isinstance(stored, BlocksStored) and stored.token_ids == (5, 6) and stored.parent_block_hash is None
    assert relay.blocks_held == 3 and relay.mirror_overflows == 0
    assert cache.admit([1, 2, 3, 4, 0]) == 2  # a1 still held, a2 gone
