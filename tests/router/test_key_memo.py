"""The block-key memo (router/cache/key_memo.py) used by block_keys.chain_keys: keys from the memo are
exactly the hashed ones, the memo is what answers for blocks keyed before, and it stays bounded."""

from __future__ import annotations

import hashlib
import random

import pytest

from vllm_fleet.router.cache import block_keys as block_keys_module
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.key_memo import KeyMemo


def _reference_keys(tokens: list[int], block_size: int, salt: str = "") -> list[int]:
    """The key format written out plainly (as test_cache_index's reference)."""
    previous = hashlib.blake2b(f"\0{salt}".encode(), digest_size=8).digest()
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[start:start + block_size])
        key = int.from_bytes(hashlib.blake2b(previous + block, digest_size=8).digest(), "little") % 2**60
        previous = key.to_bytes(8, "little")
        keys.append(key)
    return keys


@pytest.fixture
def memo(monkeypatch) -> KeyMemo:
    memo = KeyMemo(max_entries=40)
    monkeypatch.setattr(block_keys_module, "KEY_MEMO", memo)
    return memo


def test_keys_from_the_memo_equal_the_hashed_ones(memo):
    rng = random.Random(7)
    shared = [rng.randrange(50_000) for _ in range(16 * 20)]
    prompts = [shared + [rng.randrange(50_000) for _ in range(rng.randrange(0, 16 * 15))] for _ in range(30)]
    for tokens in prompts + prompts[::-1]:   # misses, hits in the recent generation and in the older one
        for salt in ("", "s"):
            assert block_keys(tokens, 16, salt=salt) == _reference_keys(tokens, 16, salt)
    assert memo.older, "the recent generation never filled: the older one was not exercised"


def test_a_block_keyed_before_is_answered_by_the_memo(memo):
    tokens = list(range(64))
    keys = block_keys(tokens, 16)
    assert len(memo.recent) == 4
    # Planting another value for the third block's input shows the memo answers, not the hash.
    third = keys[1].to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in tokens[32:48])
    memo.recent[third] = (12345).to_bytes(8, "little")
    assert block_keys(tokens, 16)[2] == 12345
    memo.clear()
    assert block_keys(tokens, 16) == keys


def test_the_memo_stays_bounded(memo):
    rng = random.Random(3)
    for _ in range(50):
        block_keys([rng.randrange(50_000) for _ in range(16 * 10)], 16)
        assert len(memo.recent) <= memo.max_entries and len(memo.older) <= memo.max_entries + 10


def test_an_older_block_moves_back_to_the_recent_generation(memo):
    tokens = list(range(16 * 5))
    block_keys(tokens, 16)
    memo.older, memo.recent = memo.recent, {}
    block_keys(tokens, 16)
    assert len(memo.recent) == 5
