"""Which worker holds which KV-cache blocks: the router's index, kept from the engines' events.

The index owns the router's view of every worker's prefix cache, keyed by our own chained hash
of the token ids (`block_keys`, router/cache/block_keys.py), never by the engine's hash: the engine's hash depends on its
release and hash seed, ours on nothing but the tokens, the block size, the LoRA adapter and the
cache salt. The engine's hashes are kept per worker only to apply its removals and to find the
key a stored block chains from. Everything here is in-process and synchronous; nothing waits on
a stream. The caller (the pool, following each worker's `KvEvents` stream) feeds it:

    index = CacheIndex(max_entries=10_000_000)
    result = index.apply("10.0.0.1:50051", batch, model="m")   # one KvEventBatch, in order
    if result is ApplyResult.NEEDS_RESYNC: resubscribe (the worker answers with a snapshot)
    index.drop_worker("10.0.0.1:50051")                        # it restarted or left

and asks it once per request, before ranking:

    keys = block_keys(prompt_token_ids, index.block_size("m"), lora=adapter, salt=cache_salt)
    held = index.matched_tokens("m", keys)          # {worker: leading tokens it holds}; absent = 0
    ... rank with held as CacheMatch.cached_tokens (router/cache/match.py), dispatch to `worker` ...
    hold = index.note_routed(worker, "m", keys)     # counted as held while its prefill runs...
    hold.first_token()                              # ...and for ttl_s after it (the event delay)
    hold.release()                                  # the attempt ended: before its first token, they go

    index.synced(worker), index.last_applied_at(worker)   # to decide WorkerView.kv_events_fresh
    index.counters, index.entries_per_worker()            # for metrics

Rules:
- Order: per worker, a batch applies only if it is a snapshot or carries the next sequence of
  the current epoch after a snapshot. Otherwise `apply` returns NEEDS_RESYNC and applies nothing;
  the worker stays out of sync (its entries kept, `synced` False) until a snapshot arrives. A new
  epoch means a new engine: its entries go at once (a cold engine holds nothing).
- A snapshot batch or AllCleared drops the worker's entries before applying what follows.
- A stored block whose parent is an engine hash this worker's entries do not know cannot be
  keyed (our key chains through the parent's); it is counted in `events_unresolved`, skipped.
- A prompt's first stored block carries the request's cache salt (vLLM's extra keys), which
  seeds the chain as it seeds ours: a salted prompt matches only blocks stored with its salt,
  on the engine as in the index. Only GPU blocks are indexed (medium "" or "GPU"); blocks
  offloaded to other media are counted in `events_other_medium` and skipped.
- One block size per model (the fleet launches a model's workers alike); a stored event with
  another block size is malformed.
- Speculative entries (`note_routed`, `extend_hold`, RoutedHold): written at routing time,
  held until the attempt's first token and `ttl_s` after it; their rules are in cache/routed_holds.py.

Memory bound: at most `max_entries` (worker, block) entries, speculative ones included. Past
it, the index evicts from the worker holding the most entries its least recently stored or
routed blocks, down to 1/64 below the bound (evicting in chunks keeps eviction O(1) amortized).
Why this order: it keeps each worker's share near max_entries / workers, so one worker's burst
of long prompts cannot erase what is known of the others; and within a worker, the blocks the
router has not sent a prompt through for longest are the ones the engine's own LRU most likely
freed already. A prefix routed again (a shared system prompt) is refreshed by `note_routed`,
so it is not lost for being stored long ago. Eviction only makes the index forget: at worst a
routing miss, never a wrong hit. Measured cost: about 210 bytes per entry (2 GiB for 10 million;
benchmarks/cache_index_scale.py).

Threads: the router looks prompts up from a thread (stream.py decides off the event loop, and
several decisions may run at once) while the loop applies events and notes routes. One lock
serialises every call that reads or changes the entries; each call is microseconds (a 2,000-token
lookup ~100 us), so nobody waits long. Without it, two lookups expiring the same speculative
entry at once failed a request (KeyError) on the H200 run of 2026-12-04.
"""

from __future__ import annotations

import enum
import itertools
import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_fleet.protocol.kv_events import AllCleared, BlocksRemoved, BlocksStored, KvEventBatch
from vllm_fleet.router.cache.block_keys import chain_keys, key_seed
from vllm_fleet.router.cache.entries import WorkerEntries
from vllm_fleet.router.cache.routed_holds import RoutedHold, RoutedHolds

__all__ = ["ApplyResult", "CacheIndex", "CacheIndexCounters", "RoutedHold"]  # RoutedHold: where callers import it


class ApplyResult(enum.Enum):
    IN_ORDER = "in_order"           # applied
    NEEDS_RESYNC = "needs_resync"   # not applied: resubscribe to get a snapshot


@dataclass(slots=True)
class CacheIndexCounters:
    """Totals since the index was made, for metrics."""

    events_applied: int = 0
    events_malformed: int = 0       # token count not blocks x block size, bad token ids, other block size
    events_unresolved: int = 0      # stored blocks whose parent hash is unknown here
    events_other_medium: int = 0    # blocks on a medium other than GPU (offloaded), not indexed
    evictions: int = 0              # (worker, block) entries evicted for the memory bound
    resyncs_needed: int = 0         # batches answered NEEDS_RESYNC
    speculative_expired: int = 0
    speculative_dropped: int = 0    # entries of attempts that ended before their first token


def _locked(method):
    """Run `method` holding the index's lock (see "Threads" in the module docstring)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class CacheIndex(RoutedHolds):
    def __init__(self, max_entries: int = 10_000_000, *, clock=time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.counters = CacheIndexCounters()
        self._clock = clock
        self._holders: dict[int, int] = {}       # our key -> bitmask of the workers holding it
        self._workers: dict[str, WorkerEntries] = {}
        self._by_bit: dict[int, WorkerEntries] = {}
        self._free_bits: list[int] = []
        self._block_sizes: dict[str, int] = {}   # model -> block size
        self._total = 0                           # (worker, block) entries, speculative included
        self._speculating: set[WorkerEntries] = set()  # workers with speculative entries
        self._lock = threading.Lock()

    # --- what the caller asks ---------------------------------------------------------------

    def block_size(self, model: str) -> int:
        """The block size of the model's workers (0 until one of them sent events)."""
        return self._block_sizes.get(model, 0)

    def synced(self, worker: str) -> bool:
        """Whether the worker's events are applied in order since its last snapshot."""
        state = self._workers.get(worker)
        return state is not None and state.synced

    def last_applied_at(self, worker: str) -> float:
        """When (index clock) a batch of the worker's was last applied; -inf if never."""
        state = self._workers.get(worker)
        return float("-inf") if state is None else state.applied_at

    @_locked
    def entries_per_worker(self) -> dict[str, int]:
        return {w.address: w.entries for w in self._workers.values()}

    def entries_of(self, worker: str) -> int:
        """The worker's entries, speculative ones included (unlocked: a read of sizes, for balance)."""
        state = self._workers.get(worker)
        return 0 if state is None else state.entries

    def __len__(self) -> int:
        return self._total

    @_locked
    def matched_tokens(self, model: str, keys: Sequence[int], *, now: float | None = None) -> dict[str, int]:
        """Per worker of `model`, the tokens of the leading blocks of `keys` it holds (absent: none).
        Walks the keys once, narrowing the set of workers still matching; stops when none is left."""
        self._expire(self._clock() if now is None else now)
        alive = 0
        for state in self._workers.values():
            if state.model == model:
                alive |= 1 << state.bit
        block_size = self._block_sizes.get(model, 0)
        matched: dict[str, int] = {}
        holders = self._holders
        depth = 0
        for key in keys:
            still = holders.get(key, 0) & alive
            if still != alive:
                self._record(alive & ~still, depth * block_size, matched)
                alive = still
                if not alive:
                    return matched
            depth += 1
        self._record(alive, depth * block_size, matched)
        return matched

    def _record(self, bits: int, tokens: int, matched: dict[str, int]) -> None:
        if tokens == 0:
            return
        while bits:
            low = bits & -bits
            matched[self._by_bit[low.bit_length() - 1].address] = tokens
            bits ^= low

    # --- what the workers say ----------------------------------------------------------------

    @_locked
    def apply(self, worker: str, batch: KvEventBatch, *, model: str, now: float | None = None) -> ApplyResult:
        """Apply one batch of `worker`'s events (see the module docstring for the order rules)."""
        state = self._worker(worker, model)
        if not batch.snapshot:
            if state.epoch is not None and batch.epoch != state.epoch:
                self._clear(state)              # a new engine: nothing we knew holds
                state.epoch = None
            if not state.synced or batch.epoch != state.epoch or batch.sequence != state.sequence + 1:
                state.synced = False
                self.counters.resyncs_needed += 1
                return ApplyResult.NEEDS_RESYNC
        else:
            self._clear(state)
            state.epoch, state.synced = batch.epoch, True
        state.sequence = batch.sequence
        state.applied_at = self._clock() if now is None else now
        if batch.block_size and model not in self._block_sizes:
            self._block_sizes[model] = batch.block_size
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self._stored(state, event)
            elif isinstance(event, BlocksRemoved):
                self._removed(state, event)
            elif isinstance(event, AllCleared):
                self._clear(state)
            self.counters.events_applied += 1
        return ApplyResult.IN_ORDER

    @_locked
    def drop_worker(self, worker: str) -> None:
        """Forget the worker (it restarted or left); its bit is reused by the next one."""
        state = self._workers.pop(worker, None)
        if state is None:
            return
        self._clear(state)
        del self._by_bit[state.bit]
        self._free_bits.append(state.bit)

    def _worker(self, address: str, model: str) -> WorkerEntries:
        state = self._workers.get(address)
        if state is None:
            bit = self._free_bits.pop() if self._free_bits else len(self._by_bit)
            state = self._workers[address] = self._by_bit[bit] = WorkerEntries(address, bit, model)
        elif state.model != model:            # the address now serves another model
            self._clear(state)
            state.model = model
        return state

    def _stored(self, state: WorkerEntries, event: BlocksStored) -> None:
        if event.medium and event.medium.upper() != "GPU":
            self.counters.events_other_medium += 1
            return
        block_size = self._block_sizes.setdefault(state.model, event.block_size)
        if (event.block_size != block_size or block_size <= 0
                or len(event.token_ids) != len(event.block_hashes) * block_size):
            self.counters.events_malformed += 1
            return
        if event.parent_block_hash is None:
            previous = key_seed(event.lora_name, event.cache_salt)
        else:
            parent = state.by_engine.get(event.parent_block_hash)
            if parent is None:
                self.counters.events_unresolved += 1
                return
            previous = parent.to_bytes(8, "little")
        try:
            keys = chain_keys(event.token_ids, block_size, previous)
        except (OverflowError, TypeError):
            self.counters.events_malformed += 1
            return
        bit = 1 << state.bit
        for engine_hash, key in zip(event.block_hashes, keys):
            self._hold(state, bit, key, engine_hash)

    def _hold(self, state: WorkerEntries, bit: int, key: int, engine_hash: bytes) -> None:
        old_key = state.by_engine.pop(engine_hash, None)
        if old_key is not None and old_key != key:     # the engine reused the hash for other tokens
            self._drop_held(state, old_key)
        old_hash = state.held.pop(key, None)
        if old_hash is not None:
            if old_hash != engine_hash:
                state.by_engine.pop(old_hash, None)
        elif state.speculative.pop(key, None) is None and state.pending.pop(key, None) is None:
            self._holders[key] = self._holders.get(key, 0) | bit
            self._total += 1
        state.held[key] = engine_hash
        state.by_engine[engine_hash] = key
        if self._total > self.max_entries:
            self._evict()

    def _removed(self, state: WorkerEntries, event: BlocksRemoved) -> None:
        if event.medium and event.medium.upper() != "GPU":
            self.counters.events_other_medium += 1
            return
        for engine_hash in event.block_hashes:
            key = state.by_engine.pop(engine_hash, None)
            if key is not None:                 # unknown: evicted here, or its store was unresolved
                del state.held[key]
                self._unhold(key, 1 << state.bit)

    def _drop_held(self, state: WorkerEntries, key: int) -> None:
        engine_hash = state.held.pop(key, None)
        if engine_hash is not None:
            state.by_engine.pop(engine_hash, None)
            self._unhold(key, 1 << state.bit)

    def _unhold(self, key: int, bit: int) -> None:
        mask = self._holders.get(key, 0) & ~bit
        if mask:
            self._holders[key] = mask
        else:
            self._holders.pop(key, None)
        self._total -= 1

    def _clear(self, state: WorkerEntries) -> None:
        bit = 1 << state.bit
        for key in itertools.chain(state.held, state.speculative, state.pending):
            self._unhold(key, bit)
        state.held, state.by_engine, state.speculative, state.pending = {}, {}, {}, {}
        self._speculating.discard(state)

    def _evict(self) -> None:
        """Down to 1/64 below the bound, from the workers holding the most, oldest first: timed
        speculative entries, then stored blocks, then those of requests still prefilling."""
        target = self.max_entries - max(1, self.max_entries // 64)
        while self._total > target:
            state = max(self._workers.values(), key=lambda w: w.entries)
            count = min(self._total - target, state.entries)
            spec = list(itertools.islice(state.speculative, count))
            for key in spec:
                del state.speculative[key]
                self._unhold(key, 1 << state.bit)
            held = list(itertools.islice(state.held, count - len(spec)))
            for key in held:
                self._drop_held(state, key)
            for key in list(itertools.islice(state.pending, count - len(spec) - len(held))):
                del state.pending[key]
                self._unhold(key, 1 << state.bit)
            self.counters.evictions += count
