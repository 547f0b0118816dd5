"""Whether new prompts come back: the worth of a prompt's home in cache routing.

A cache-aware router sends a prompt that is mostly new (no worker holds most of it) to its home
(policies.CacheAware), so that the next prompt sharing it finds it in one place, and so that two
routers that do not see each other's load (two Spark executors, two gateway processes) put one
new document on the same worker. That pull costs load: the miss may wait behind up to
`home_tokens` of other work at its home instead of going to the least busy worker. It pays only
if later prompts reuse what the new one leaves cached. A fleet whose prompts share nothing
(workload (c) of issue #26) pays it on every request and never gains: on 2 real CPU engines that
put cache_aware's P90 TTFT at 1.30-1.42x least outstanding's, and at 0.84-0.89x with no home
(benchmarks/RESULTS.md, 2026-12-05).

`PrefixReuse` watches what became of the new parts of mostly-new prompts: each one's frontier
(its first block no worker held) waits in a window; a later prompt whose held blocks include it
credits it as reused, and one that leaves the window unused counts against (a reuse that comes
later is still credited). The share, weighted by the new tokens and decayed, is what the home is
worth: near 1 where new documents come back (rows of one text, tenants' documents, chat
histories), near 0 where nothing does. The window is 8 mostly-new prompts and grows to twice
the longest gap between a new part and its reuse seen so far, so a job that interleaves many
documents (a Spark table shuffled over 50 of them) is judged over its own rhythm: simulated
with 24-1,000 documents shuffled, the share averaged 0.85-0.98 over the job (1.0 at 8
documents), and ten unique prompts after the first eight take it under 0.1.

Why not the share of arriving tokens found cached (tried 2026-12-04 and reverted): every job
starts with misses, so that share is lowest exactly when a job's documents are being placed, and
two Spark executors' routers then placed one document on both workers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

PRIOR_TOKENS = 512   # the prior: one new part of this many tokens, reused
WINDOW = 8           # the least mostly-new prompts a new part may wait for its reuse before it counts as unused
MOST_WINDOW = 1024   # the window's bound (twice the longest reuse gap seen, at most this)
MEMORY = 32          # resolved new parts: each weighs 1/MEMORY against those before it
LATE = 4             # windows of new parts counted unused whose reuse is still credited when it comes


class PrefixReuse:
    def __init__(self, *, window: int = WINDOW, memory: int = MEMORY, prior_tokens: int = PRIOR_TOKENS) -> None:
        self.window = window
        self._keep = 1.0 - 1.0 / memory
        self._reused = float(prior_tokens)
        self._resolved = float(prior_tokens)
        self._count = 0   # mostly-new prompts so far: a new part's place in that sequence dates it
        self._waiting: OrderedDict[int, tuple[int, int]] = OrderedDict()  # frontier key -> (new tokens, its count)
        self._unused: OrderedDict[int, tuple[int, int]] = OrderedDict()   # left the window unused, still creditable
        self._lock = threading.Lock()   # routers key prompts on threads (stream.py)

    @property
    def share(self) -> float:
        """Of the new parts resolved lately, the decayed token share that later prompts reused (0..1)."""
        with self._lock:
            return min(1.0, self._reused / self._resolved)

    def note(self, held_keys: Sequence[int], frontier: int | None, new_tokens: int) -> None:
        """A prompt arrived holding `held_keys` (its leading blocks some worker holds); `frontier`
        is its first block held nowhere when the prompt is mostly new (None otherwise), and
        `new_tokens` how many of its tokens no worker held."""
        with self._lock:
            if self._waiting or self._unused:
                # A dict lookup per held block: ~5 us for a 2,000-token prompt of 16-token blocks.
                for key in held_keys:
                    if key in self._waiting:
                        tokens, placed = self._waiting.pop(key)
                        self._resolve(tokens, reused=True)
                    elif key in self._unused:
                        tokens, placed = self._unused.pop(key)
                        self._reused += tokens   # already counted unused: now it was not
                    else:
                        continue
                    self.window = max(self.window, min(MOST_WINDOW, 2 * (self._count - placed)))
            if frontier is None or new_tokens <= 0:
                return
            self._count += 1
            self._waiting[frontier] = (new_tokens, self._count)
            self._waiting.move_to_end(frontier)
            while len(self._waiting) > self.window:
                key, entry = self._waiting.popitem(last=False)
                self._resolve(entry[0], reused=False)
                self._unused[key] = entry
                while len(self._unused) > LATE * self.window:
                    self._unused.popitem(last=False)

    def _resolve(self, tokens: int, *, reused: bool) -> None:
        self._reused *= self._keep
        self._resolved *= self._keep
        self._resolved += tokens
        if reused:
            self._reused += tokens
        self._reused = min(self._reused, self._resolved)
