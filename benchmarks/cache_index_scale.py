"""The router's cache index at scale: memory for 10 million (worker, block) entries, and the
time of one cache-aware routing decision for a 2,000-token prompt against it.

    python benchmarks/cache_index_scale.py [--entries 10000000] [--workers 8] [--lookups 2000]

Fill: 8 workers of model m16 (16-token blocks) take 80% of the entries and 8 workers of m128
(128-token blocks) the rest, through `CacheIndex.apply` with the events vLLM would send: each
prompt a BlocksStored chained (by engine hash) onto one of 32 shared system prompts, in batches
of 16 events. Memory is the process's resident-set growth over the fill (an upper bound: freed
event objects may stay in the allocator's arenas), divided per entry.

Lookups: a 2,000-token prompt that shares its system prompt and part of one stored prompt with
one worker; timed are `block_keys` + `matched_tokens` (the index's part) and that plus building
RequestFeatures and ranking 8 workers with the cache_aware policy (the whole decision).
`block_keys` alone is timed too: it touches no index, so a tail it shares with the others comes
from the machine (a shared 2-core host preempts a process for a 4 ms scheduler slice now and
then), not from the index's size.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time

from vllm_fleet.bench import percentile
from vllm_fleet.protocol.kv_events import BlocksStored, KvEventBatch
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.index import CacheIndex
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import make_policy
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView

SYSTEM_PROMPTS = 32
SYSTEM_TOKENS = 256
PROMPT_TOKENS = 2000
BATCH_EVENTS = 16


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def system_tokens(s: int) -> list[int]:
    return [1_000_000 + s * SYSTEM_TOKENS + t for t in range(SYSTEM_TOKENS)]


def prompt_tokens(worker: int, n: int, length: int) -> list[int]:
    """The tokens after the system prompt of the worker's n-th prompt (unique per worker and n)."""
    base = 10_000_000 + (worker * 1_000_000 + n) * 4096 // 16
    return [(base + t) % 4_000_000_000 for t in range(length)]


class Filler:
    """One worker's engine: stores system prompts once, then prompts chained onto them."""

    def __init__(self, index: CacheIndex, address: str, worker: int, model: str, block_size: int) -> None:
        self.index, self.address, self.worker, self.model, self.block_size = index, address, worker, model, block_size
        self.sequence = 0
        self.next_hash = worker << 40
        self.system_tail: dict[int, bytes] = {}   # system prompt -> engine hash of its last block
        self.prompts = 0
        index.apply(address, KvEventBatch("epoch", 0, 0.0, (), snapshot=True, block_size=block_size), model=model)

    def hashes(self, count: int) -> tuple[bytes, ...]:
        first, self.next_hash = self.next_hash, self.next_hash + count
        return tuple((first + i).to_bytes(8, "big") for i in range(count))

    def batch(self, prompt_blocks: int) -> int:
        """Send one batch of prompts; the entries it added."""
        events, added = [], 0
        for _ in range(BATCH_EVENTS):
            s = (self.worker * 7 + self.prompts) % SYSTEM_PROMPTS
            if s not in self.system_tail:
                blocks = SYSTEM_TOKENS // self.block_size
                hashes = self.hashes(blocks)
                events.append(BlocksStored(hashes, None, tuple(system_tokens(s)), self.block_size))
                self.system_tail[s] = hashes[-1]
                added += blocks
            tokens = prompt_tokens(self.worker, self.prompts, prompt_blocks * self.block_size)
            events.append(BlocksStored(self.hashes(prompt_blocks), self.system_tail[s], tuple(tokens), self.block_size))
            added += prompt_blocks
            self.prompts += 1
        self.sequence += 1
        self.index.apply(self.address, KvEventBatch("epoch", self.sequence, 0.0, tuple(events)), model=self.model)
        return added

    def lookup_prompt(self, rng: random.Random) -> list[int]:
        """2,000 tokens: a stored prompt's system prompt and some of its blocks, then new tokens."""
        n = rng.randrange(self.prompts)
        s = (self.worker * 7 + n) % SYSTEM_PROMPTS
        shared = rng.randrange(0, PROMPT_TOKENS - SYSTEM_TOKENS)
        stored = prompt_tokens(self.worker, n, PROMPT_TOKENS)[:shared]
        return (system_tokens(s) + stored + [7] * PROMPT_TOKENS)[:PROMPT_TOKENS]


def fill(index: CacheIndex, entries: int, workers: int) -> dict[str, list[Filler]]:
    fillers = {
        "m16": [Filler(index, f"10.0.0.{w}:50051", w, "m16", 16) for w in range(workers)],
        "m128": [Filler(index, f"10.0.1.{w}:50051", workers + w, "m128", 128) for w in range(workers)],
    }
    quota = {"m16": int(entries * 0.8), "m128": entries - int(entries * 0.8)}
    blocks = {"m16": 64, "m128": 16}            # prompts of 1,024 and 2,048 tokens after the system prompt
    for model, group in fillers.items():
        added = 0
        while added < quota[model]:
            for filler in group:
                added += filler.batch(blocks[model])
    return fillers


def time_lookups(index: CacheIndex, fillers: list[Filler], model: str, lookups: int, rng: random.Random) -> dict:
    policy = make_policy("cache_aware")
    views = PoolSnapshot(tuple(WorkerView(f.address, model=model, kv_events_fresh=True,
                                          outstanding_tokens=rng.randrange(5000)) for f in fillers))
    block_size = index.block_size(model)
    prompts = [rng.choice(fillers).lookup_prompt(rng) for _ in range(lookups)]
    keys_us, index_us, decision_us, hits = [], [], [], 0
    for ticket, prompt in enumerate(prompts):
        start = time.perf_counter()
        keys = block_keys(prompt, block_size)
        hashed = time.perf_counter()
        held = index.matched_tokens(model, keys)
        middle = time.perf_counter()
        features = RequestFeatures(model=model, prompt_tokens=len(prompt), max_tokens=256, ticket=ticket)
        policy.rank(features, views, CacheMatch(cached_tokens=held))
        end = time.perf_counter()
        keys_us.append((hashed - start) * 1e6)
        index_us.append((middle - start) * 1e6)
        decision_us.append((end - start) * 1e6)
        hits += bool(held)
    return {"keys_us": keys_us, "index_us": index_us, "decision_us": decision_us, "hits": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000_000, help="(worker, block) entries to fill")
    parser.add_argument("--workers", type=int, default=8, help="workers per model (two models)")
    parser.add_argument("--lookups", type=int, default=2000, help="timed routing decisions per block size")
    args = parser.parse_args()

    gc.collect()
    before = rss_bytes()
    index = CacheIndex(max_entries=args.entries + args.entries // 10)
    started = time.perf_counter()
    fillers = fill(index, args.entries, args.workers)
    fill_s = time.perf_counter() - started
    gc.collect()
    used = rss_bytes() - before
    total = len(index)
    print(f"python {sys.version.split()[0]}; entries {total:,} over {2 * args.workers} workers "
          f"(distinct blocks {len(index._holders):,}); fill {fill_s:.1f} s "
          f"({index.counters.events_applied:,} events, {total / fill_s:,.0f} entries/s)")
    print(f"resident memory growth {used / 2**20:,.0f} MiB = {used / total:.0f} bytes per entry")
    print(f"counters {index.counters}")
    rng = random.Random(7)
    for model in ("m16", "m128"):
        result = time_lookups(index, fillers[model], model, args.lookups, rng)
        print(f"{model} block size {index.block_size(model)}, {PROMPT_TOKENS}-token prompts, {args.lookups} lookups, "
              f"{result['hits']} with a cached prefix:")
        for label, key in (("block_keys alone (no index)", "keys_us"), ("block_keys+matched_tokens", "index_us"),
                           ("whole decision (+features, rank 8)", "decision_us")):
            values = result[key]
            over = sum(v > 1000 for v in values)
            print(f"  {label:<36} P50 {percentile(values, 50):5.0f} us  P90 {percentile(values, 90):5.0f} us  "
                  f"P99 {percentile(values, 99):5.0f} us  over 1 ms: {over}")


if __name__ == "__main__":
    main()
