"""The router's cache index: our own chained keys, events applied in order, a memory bound."""

from __future__ import annotations

import hashlib
import random

import pytest

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored, KvEventBatch
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.index import ApplyResult, CacheIndex

BS = 4
W1, W2 = "10.0.0.1:50051", "10.0.0.2:50051"
PROMPT = list(range(100, 124))      # 6 blocks of 4


def h(i: int) -> bytes:
    return i.to_bytes(8, "big")


def stored(first: int, count: int, tokens: list[int], parent: int | None = None, **kwargs) -> BlocksStored:
    """Blocks with engine hashes first..first+count-1 holding `tokens`."""
    return BlocksStored(tuple(h(first + i) for i in range(count)), None if parent is None else h(parent),
                        tuple(tokens), BS, **kwargs)


class Feed:
    """Sends one worker's batches with consecutive sequence numbers after a snapshot."""

    def __init__(self, index: CacheIndex, worker: str, model: str = "m", epoch: str = "e1") -> None:
        self.index, self.worker, self.model, self.epoch, self.sequence = index, worker, model, epoch, 0

    def snapshot(self, *events) -> ApplyResult:
        self.sequence = 0
        return self.index.apply(self.worker, KvEventBatch(self.epoch, 0, 0.0, events, snapshot=True, block_size=BS),
                                model=self.model)

    def send(self, *events, sequence: int | None = None) -> ApplyResult:
        self.sequence = self.sequence + 1 if sequence is None else sequence
        return self.index.apply(self.worker, KvEventBatch(self.epoch, self.sequence, 0.0, events, block_size=BS),
                                model=self.model)


@pytest.fixture
def index():
    return CacheIndex(max_entries=10_000, clock=lambda: 0.0)


def matched(index: CacheIndex, tokens=PROMPT, **kwargs) -> dict[str, int]:
    return index.matched_tokens("m", block_keys(tokens, BS, **kwargs), now=0.0)


def test_keys_chain_and_depend_on_lora_and_salt():
    keys = block_keys(PROMPT, BS)
    assert len(keys) == 6 and len(set(keys)) == 6 and all(0 <= k < 2**64 for k in keys)
    assert block_keys(PROMPT + [1, 2], BS) == keys                    # a partial block has no key
    assert block_keys(PROMPT[:8], BS) == keys[:2]                     # a prefix gives a prefix
    changed = block_keys([0] + PROMPT[1:], BS)
    assert all(a != b for a, b in zip(changed, keys))                 # a change in block 0 changes every key
    assert block_keys(PROMPT[4:], BS)[0] != keys[1]                   # the same block after another differs
    for other in (block_keys(PROMPT, BS, lora="a"), block_keys(PROMPT, BS, salt="s")):
        assert not set(other) & set(keys)
    assert block_keys(PROMPT, 8) != keys[:3]


def _reference_keys(tokens: list[int], block_size: int, lora: str = "", salt: str = "") -> list[int]:
    """The key format written out plainly: blake2b-64 of the previous key (for the first block,
    of "lora\0salt") and the block's ids as little-endian uint32, read little-endian, cut to 60
    bits. Routers of different releases share the workers' events: a change here must be deliberate."""
    previous = hashlib.blake2b(f"{lora}\0{salt}".encode(), digest_size=8).digest()
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[start:start + block_size])
        key = int.from_bytes(hashlib.blake2b(previous + block, digest_size=8).digest(), "little") % 2**60
        keys.append(key)
        previous = key.to_bytes(8, "little")
    return keys


@pytest.mark.parametrize("block_size", [1, 4, 16, 128])
@pytest.mark.parametrize("seed", ["", "lora-a", "salt"])
def test_keys_equal_the_plain_reference(block_size, seed):
    rng = random.Random(block_size)
    tokens = [rng.randrange(2**32) for _ in range(2000 + block_size // 2)]   # a partial block at the end
    kwargs = {"salt": seed} if seed == "salt" else {"lora": seed}
    assert block_keys(tokens, block_size, **kwargs) == _reference_keys(tokens, block_size, **kwargs)
    assert block_keys(tokens[:block_size - 1], block_size, **kwargs) == []


def test_stored_blocks_match_a_prompt_by_its_leading_blocks(index):
    feed = Feed(index, W1)
    feed.snapshot()
    assert feed.send(stored(1, 3, PROMPT[:12])) is ApplyResult.IN_ORDER
    assert feed.send(stored(4, 1, PROMPT[12:16], parent=3)) is ApplyResult.IN_ORDER   # chains from the engine hash
    assert matched(index) == {W1: 16}
    assert matched(index, PROMPT[:4] + [9, 9, 9, 9] + PROMPT[8:]) == {W1: 4}           # stops at the first miss
    assert index.matched_tokens("other-model", block_keys(PROMPT, BS)) == {}
    assert index.counters.events_applied == 2 and len(index) == 4


def test_removed_blocks_stop_the_match_there(index):
    feed = Feed(index, W1)
    feed.snapshot(stored(1, 4, PROMPT[:16]))
    feed.send(BlocksRemoved((h(3),)))
    assert matched(index) == {W1: 8}
    assert index.entries_per_worker() == {W1: 3}


def test_each_worker_gets_its_own_prefix_length(index):
    Feed(index, W1).snapshot(stored(1, 6, PROMPT))
    Feed(index, W2).snapshot(stored(50, 2, PROMPT[:8]))
    assert matched(index) == {W1: 24, W2: 8}


def test_lora_blocks_match_only_prompts_for_that_adapter(index):
    Feed(index, W1).snapshot(stored(1, 2, PROMPT[:8], lora_name="sql"))
    assert matched(index) == {}
    assert matched(index, lora="sql") == {W1: 8}


def test_salted_blocks_match_only_prompts_with_that_salt(index):
    # The salt rides on the prompt's first block only (as vLLM hashes it); the chain carries it on.
    feed = Feed(index, W1)
    feed.snapshot(stored(1, 2, PROMPT[:8], cache_salt="tenant-a"))
    feed.send(stored(3, 1, PROMPT[8:12], parent=2))
    assert matched(index, salt="tenant-a") == {W1: 12}
    assert matched(index) == {} and matched(index, salt="tenant-b") == {}


def test_all_cleared_and_snapshot_replace_what_a_worker_held(index):
    feed = Feed(index, W1)
    feed.snapshot(stored(1, 4, PROMPT[:16]))
    feed.send(AllCleared(), stored(10, 1, PROMPT[:4]))
    assert matched(index) == {W1: 4} and len(index) == 1
    other = [7] * 8
    feed.snapshot(stored(20, 2, other))               # the whole cache now: PROMPT's block is gone
    assert matched(index) == {} and matched(index, other) == {W1: 8} and len(index) == 2
    feed.send(BlocksRemoved((h(10),)))                # a hash from before the snapshot: no longer known
    assert matched(index, other) == {W1: 8}


def test_drop_worker_forgets_it_and_reuses_its_bit(index):
    Feed(index, W1).snapshot(stored(1, 4, PROMPT[:16]))
    Feed(index, W2).snapshot(stored(1, 2, PROMPT[:8]))
    index.drop_worker(W1)
    assert matched(index) == {W2: 8} and index.entries_per_worker() == {W2: 2}
    Feed(index, "10.0.0.3:50051").snapshot()      # takes W1's bit: must not inherit its blocks
    assert matched(index) == {W2: 8}


def test_gap_needs_resync_and_applies_nothing_until_a_snapshot(index):
    feed = Feed(index, W1)
    feed.snapshot(stored(1, 1, PROMPT[:4]))
    assert feed.send(stored(2, 1, PROMPT[4:8], parent=1), sequence=2) is ApplyResult.NEEDS_RESYNC   # 1 missing
    assert matched(index) == {W1: 4} and not index.synced(W1)
    assert feed.send(stored(2, 1, PROMPT[4:8], parent=1), sequence=3) is ApplyResult.NEEDS_RESYNC   # still out
    assert index.counters.resyncs_needed == 2 and matched(index) == {W1: 4}
    assert feed.snapshot(stored(1, 2, PROMPT[:8])) is ApplyResult.IN_ORDER
    assert index.synced(W1) and feed.send(stored(3, 1, PROMPT[8:12], parent=2)) is ApplyResult.IN_ORDER
    assert matched(index) == {W1: 12}


def test_first_batch_must_be_a_snapshot(index):
    assert Feed(index, W1).send(stored(1, 1, PROMPT[:4])) is ApplyResult.NEEDS_RESYNC
    assert matched(index) == {}


def test_new_epoch_drops_the_workers_blocks_and_needs_resync(index):
    Feed(index, W1).snapshot(stored(1, 2, PROMPT[:8]))
    restarted = Feed(index, W1, epoch="e2")
    assert restarted.send(stored(5, 1, PROMPT[:4]), sequence=1) is ApplyResult.NEEDS_RESYNC
    assert matched(index) == {} and len(index) == 0


def test_unknown_parent_is_counted_and_skipped(index):
    feed = Feed(index, W1)
    feed.snapshot()
    feed.send(stored(7, 1, PROMPT[4:8], parent=99))
    assert index.counters.events_unresolved == 1 and len(index) == 0
    feed.send(BlocksStored((h(1),), None, tuple(PROMPT[:3]), BS))       # 3 tokens for a 4-token block
    assert index.counters.events_malformed == 1 and len(index) == 0


def test_speculative_entries_count_until_their_ttl(index):
    keys = block_keys(PROMPT, BS)
    Feed(index, W1).snapshot()                           # the model's block size comes with events
    hold = index.note_routed(W2, "m", keys, ttl_s=2.0, now=10.0)
    hold.first_token(now=10.0)
    assert index.matched_tokens("m", keys, now=11.0) == {W2: 24}
    assert index.matched_tokens("m", keys, now=12.5) == {} and len(index) == 0
    assert index.counters.speculative_expired == 6


def test_speculative_entries_stay_while_the_request_prefills(index):
    keys = block_keys(PROMPT, BS)
    Feed(index, W1).snapshot()
    hold = index.note_routed(W2, "m", keys, ttl_s=2.0, now=10.0)
    # A long prefill (or a queue in the engine): nothing is stored yet, however long it takes.
    assert index.matched_tokens("m", keys, now=100.0) == {W2: 24}
    hold.first_token(now=100.0)                          # from here, only the events' delay is left
    assert index.matched_tokens("m", keys, now=101.9) == {W2: 24}
    assert index.matched_tokens("m", keys, now=102.1) == {} and len(index) == 0
    hold.release(now=102.1)                              # the attempt's end changes nothing now
    assert index.counters.speculative_expired == 6 and index.counters.speculative_dropped == 0


def test_an_attempt_ended_before_its_first_token_drops_its_entries(index):
    keys = block_keys(PROMPT, BS)
    Feed(index, W1).snapshot()
    hold = index.note_routed(W2, "m", keys, ttl_s=2.0, now=10.0)
    hold.release(now=10.5)                               # failed or withdrawn: the engine stored nothing
    assert index.matched_tokens("m", keys, now=10.5) == {} and len(index) == 0
    assert index.counters.speculative_dropped == 6
    hold.first_token(now=10.5)                           # too late: the hold is closed
    assert len(index) == 0


def test_entries_shared_by_requests_stay_for_the_one_still_prefilling(index):
    keys = block_keys(PROMPT, BS)
    Feed(index, W1).snapshot()
    first = index.note_routed(W2, "m", keys, ttl_s=2.0, now=0.0)
    second = index.note_routed(W2, "m", keys[:3], ttl_s=2.0, now=1.0)
    assert len(index) == 6                               # one entry per block, however many requests
    first.first_token(now=5.0)
    assert index.matched_tokens("m", keys, now=30.0) == {W2: 12}   # the second still prefills its 3 blocks
    second.release(now=30.0)                             # ...and fails: nothing of it was stored
    assert index.matched_tokens("m", keys, now=30.0) == {} and len(index) == 0

    first = index.note_routed(W2, "m", keys, ttl_s=2.0, now=40.0)
    second = index.note_routed(W2, "m", keys, ttl_s=2.0, now=40.0)
    first.first_token(now=41.0)
    second.release(now=42.0)                             # the first's blocks are stored: kept to its expiry
    assert index.matched_tokens("m", keys, now=42.5) == {W2: 24}
    assert index.matched_tokens("m", keys, now=43.5) == {}


def test_confirmed_speculative_entry_outlives_the_ttl(index):
    keys = block_keys(PROMPT, BS)
    feed = Feed(index, W1)
    feed.snapshot()
    hold = index.note_routed(W1, "m", keys[:2], ttl_s=2.0, now=0.0)
    feed.send(stored(1, 2, PROMPT[:8]))                  # the engine's events confirm both blocks
    assert len(index) == 2                               # one entry each, not two
    hold.release(now=0.0)                                # confirmed: the attempt's end does not drop them
    assert index.matched_tokens("m", keys, now=100.0) == {W1: 8}


def test_a_cleared_worker_ignores_its_old_holds(index):
    keys = block_keys(PROMPT, BS)
    feed = Feed(index, W1)
    feed.snapshot()
    old = index.note_routed(W1, "m", keys, ttl_s=2.0, now=0.0)
    feed.snapshot()                                      # a snapshot replaces what it held
    new = index.note_routed(W1, "m", keys, ttl_s=2.0, now=0.0)
    old.release(now=0.0)                                 # not the new request's entries
    assert index.matched_tokens("m", keys, now=50.0) == {W1: 24}
    new.release(now=50.0)
    assert len(index) == 0 and sum(index.entries_per_worker().values()) == 0


@pytest.mark.parametrize("max_entries", [1, 7, 50])
def test_memory_bound_holds_and_keeps_recent_blocks(max_entries):
    index = CacheIndex(max_entries=max_entries, clock=lambda: 0.0)
    feeds = [Feed(index, f"10.0.0.{i}:50051") for i in range(3)]
    for feed in feeds:
        feed.snapshot()
    for round_ in range(40):
        for n, feed in enumerate(feeds):
            tokens = [round_ * 1000 + n * 100 + t for t in range(4 * BS)]
            feed.send(stored(round_ * 10 + 1, 4, tokens))
            assert len(index) <= max_entries
            assert sum(index.entries_per_worker().values()) == len(index)
    assert index.counters.evictions == 3 * 40 * 4 - len(index)
    if max_entries >= 50:                                   # the newest chains survive, the oldest went
        assert matched(index, [39_000 + 200 + t for t in range(16)]) == {feeds[2].worker: 16}
        assert matched(index, [200 + t for t in range(16)]) == {}
        assert max(index.entries_per_worker().values()) - min(index.entries_per_worker().values()) <= 4


def test_memory_bound_counts_speculative_entries():
    index = CacheIndex(max_entries=10, clock=lambda: 0.0)
    Feed(index, W1).snapshot()
    for n in range(20):
        index.note_routed(W1 if n % 2 else W2, "m", block_keys([n] * 16, BS), now=0.0)
        assert len(index) <= 10
    assert index.counters.evictions == 80 - len(index)


def test_routing_a_prefix_again_keeps_it_from_eviction():
    index = CacheIndex(max_entries=40, clock=lambda: 0.0)
    feed = Feed(index, W1)
    feed.snapshot(stored(1, 4, PROMPT[:16]))           # the oldest blocks: first to go...
    hot = block_keys(PROMPT[:16], BS)
    for round_ in range(1, 30):
        index.note_routed(W1, "m", hot, now=0.0)       # ...unless prompts keep going through them
        feed.send(stored(round_ * 10 + 1, 4, [round_ * 1000 + t for t in range(16)]))
    assert index.counters.evictions > 0
    assert matched(index, PROMPT[:16]) == {W1: 16}


def test_the_router_keys_a_request_with_its_cache_salt():
    # The engine keys a salted prompt's blocks by the salt (and its events say so): the router's
    # keys for the request must carry it too, or salted prompts would never match their blocks.
    from vllm_fleet.protocol import GenerateInput, SamplingParams
    from vllm_fleet.protocol.sampling import build_request
    from vllm_fleet.router.cache.routing import cache_salt

    salted = build_request("r1", [GenerateInput(token_ids=PROMPT)], SamplingParams(max_tokens=1),
                           extra_body={"cache_salt": "tenant-a"})
    plain = build_request("r2", [GenerateInput(token_ids=PROMPT)], SamplingParams(max_tokens=1))
    assert cache_salt(salted) == "tenant-a" and cache_salt(plain) == ""


def test_a_requests_frontier_is_its_first_block_no_worker_holds(index):
    # The frontier names a miss's home (CacheAware): past what any worker holds, so prompts that
    # share a long start but differ after it get different homes.
    from vllm_fleet.protocol import GenerateInput, SamplingParams
    from vllm_fleet.protocol.sampling import build_request
    from vllm_fleet.router import RouterConfig
    from vllm_fleet.router.cache.routing import CacheRouting
    from vllm_fleet.router.features import RequestFeatures

    routing = CacheRouting(RouterConfig(policy="cache_aware"), connect=lambda address: None, metrics=None)
    routing.index = index
    routing._block_sizes["m"] = BS
    keys = block_keys(PROMPT, BS)

    def frontier(tokens: list[int]) -> str:
        request = build_request("r", [GenerateInput(token_ids=tokens)], SamplingParams(max_tokens=1))
        _, prompt = routing.match(request, RequestFeatures(model="m"))
        return prompt.match.frontier_key

    assert frontier(PROMPT) == str(keys[0])                     # held nowhere: its first block
    Feed(index, W1).snapshot(stored(1, 2, PROMPT[:8]))          # W1 holds the first two blocks
    assert frontier(PROMPT) == str(keys[2])
    other = PROMPT[:8] + [900 + i for i in range(16)]          # same start, then its own text
    assert frontier(other) == str(block_keys(other, BS)[2]) != frontier(PROMPT)
    Feed(index, W2).snapshot(stored(11, 6, PROMPT))             # all of it held: its last block
    assert frontier(PROMPT) == str(keys[-1])
