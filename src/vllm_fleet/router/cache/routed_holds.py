"""Speculative cache entries: where the router sent a prompt, counted as held before the engine says so.

The cache index (cache/index.py) learns what a worker holds from its KV events, which come after
the engine prefilled the prompt. A prompt routed now is counted as held where it went at once,
so the next request with the same prefix finds it there. This module is that half of the index:
`CacheIndex.note_routed` writes the entries and hands back a RoutedHold, `extend_hold` adds the
rest of a head-keyed prompt to it, and the hold's `first_token()` or `release()` ends it.

Rules:
- Speculative entries (`note_routed`) stay while their request is in flight without its first
  token: a long prefill, or a request queued in the engine, has stored nothing yet, so no time
  from routing can cover it. At the first token the engine holds the prompt's blocks, and only
  the event delay is left: the entries expire `ttl_s` later, in the order their requests got
  their first tokens, checked at each lookup and note. An attempt that ends before its first
  token (failed, cancelled, withdrawn) drops its entries at once, unless another request in
  flight or started holds them too. A stored event for the same block makes the entry a real one.

RoutedHolds is a part of CacheIndex written in its own file, not an object of its own: it works
on the index's entries (`_holders`, `_total`, `_unhold`, `_evict`, `_speculating`, `counters`),
on each worker's `speculative` and `pending` keys (WorkerEntries, entries.py), and under the
index's `_lock`, because an entry is one entry whether the router or an event wrote it (memory
bound and eviction count them together). A RoutedHold knows its index only as a HoldEnds: the
one call that ends a hold's entries.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from vllm_fleet.router.cache.entries import WorkerEntries

# A hold's entries: (the worker's entries, our key, its pending entry [holders, expiry]).
HeldEntries = list[tuple[WorkerEntries, int, list]]


class HoldEnds(Protocol):
    """What a RoutedHold needs of its index: ending its entries, once."""

    def end_hold(self, entries: HeldEntries, started: bool, ttl_s: float, now: float | None) -> None: ...


class RoutedHold:
    """One routed attempt's speculative entries (`CacheIndex.note_routed`): held until
    `first_token()` starts their ttl, or `release()` ends the attempt (before its first token:
    they go). Both are idempotent; only the first of them counts."""

    __slots__ = ("_index", "_entries", "_ttl_s", "_open")

    def __init__(self, index: HoldEnds, entries: HeldEntries, ttl_s: float) -> None:
        self._index = index
        self._entries = entries     # (worker, key, its pending entry): a cleared or evicted one is skipped
        self._ttl_s = ttl_s
        self._open = True

    @property
    def is_open(self) -> bool:
        """Neither `first_token()` nor `release()` yet: entries added now still count."""
        return self._open

    def first_token(self, *, now: float | None = None) -> None:
        """The engine prefilled the prompt: it holds the blocks, and its events are on their way."""
        self._end(started=True, now=now)

    def release(self, *, now: float | None = None) -> None:
        """The attempt ended. Before its first token nothing was stored: the entries go now."""
        self._end(started=False, now=now)

    def _end(self, *, started: bool, now: float | None) -> None:
        if self._open:
            self._open = False
            self._index.end_hold(self._entries, started, self._ttl_s, now)


class RoutedHolds:
    """CacheIndex's speculative entries (see the module docstring); CacheIndex derives from it.
    Every public method holds the index's lock ("Threads" in cache/index.py)."""

    # --- what the router did -----------------------------------------------------------------

    def note_routed(self, worker: str, model: str, keys: Sequence[int], *, ttl_s: float = 2.0,
                    now: float | None = None) -> RoutedHold:
        """The router just sent a prompt with these keys to `worker`: count them as held there
        until the returned hold's `first_token()` and `ttl_s` after it (the engine's events come
        later), or until its `release()` before a first token; refresh the blocks it holds already."""
        with self._lock:
            now = self._clock() if now is None else now
            self._expire(now)
            return RoutedHold(self, self._note_pending(self._worker(worker, model), keys), ttl_s)

    def extend_hold(self, hold: RoutedHold, worker: str, model: str, keys: Sequence[int]) -> None:
        """More of the prompt of `hold`'s attempt at `worker` (the rest of a head-keyed one): held
        as its first keys are. An attempt that has ended by now adds nothing: one that got its
        first token has its events on the way, one without stored nothing."""
        with self._lock:
            if hold.is_open:
                hold._entries.extend(self._note_pending(self._worker(worker, model), keys))

    def _note_pending(self, state: WorkerEntries, keys: Sequence[int]) -> HeldEntries:
        bit = 1 << state.bit
        pending = state.pending
        mine: HeldEntries = []
        for key in keys:
            engine_hash = state.held.pop(key, None)
            if engine_hash is not None:
                state.held[key] = engine_hash     # refreshed: the engine touches it too
                continue
            entry = pending.get(key)
            if entry is not None:
                entry[0] += 1
            else:
                # A key noted by a request that got its first token keeps that expiry at least.
                expiry = state.speculative.pop(key, None)
                if expiry is None:
                    self._holders[key] = self._holders.get(key, 0) | bit
                    self._total += 1
                    expiry = float("-inf")
                entry = pending[key] = [1, expiry]
            mine.append((state, key, entry))
            if self._total > self.max_entries:
                self._evict()
        return mine

    def end_hold(self, entries: HeldEntries, started: bool, ttl_s: float, now: float | None) -> None:
        """A hold's attempt got its first token (`started`) or ended without one."""
        with self._lock:
            now = self._clock() if now is None else now
            self._expire(now)
            expiry = now + ttl_s if started else float("-inf")
            for state, key, entry in entries:
                if state.pending.get(key) is not entry:
                    continue                          # confirmed by an event, evicted, or the worker cleared
                entry[0] -= 1
                entry[1] = max(entry[1], expiry)
                if entry[0]:
                    continue                          # another request holding it has no first token yet
                del state.pending[key]
                if entry[1] > now:
                    # Appended: the ttl is the same for every request, so the order stays the expiry
                    # order, but for a key an ended attempt hands back with an earlier request's expiry,
                    # which may then outlive it by less than one ttl.
                    state.speculative[key] = entry[1]
                    self._speculating.add(state)
                else:
                    self._unhold(key, 1 << state.bit)
                    self.counters.speculative_dropped += 1

    def _expire(self, now: float) -> None:
        for state in list(self._speculating):
            speculative = state.speculative
            expired = list(itertools.takewhile(lambda item: item[1] <= now, speculative.items()))
            for key, _ in expired:
                del speculative[key]
                self._unhold(key, 1 << state.bit)
            self.counters.speculative_expired += len(expired)
            if not speculative:
                self._speculating.discard(state)
