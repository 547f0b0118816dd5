"""How much of what arrives was cached somewhere: the worth of a prompt's home in cache routing.

A cache-aware router sends a prompt no worker holds to its home (policies.CacheAware), so that
the next prompt sharing it finds it in one place. That pull costs load: a miss may wait behind
up to `home_tokens` of someone else's work at its home instead of going to the least busy
worker. It pays only if later prompts reuse what this one leaves cached. A fleet whose prompts
share nothing (workload (c) of issue #26) pays the pull on every request and never gains: on 2
real CPU engines that put cache_aware's P90 TTFT at 1.30-1.42x least outstanding's, and at
0.84-0.89x with no home (benchmarks/RESULTS.md, 2026-12-05).

`PrefixReuse` keeps the share of recent prompt tokens that some worker held when they arrived
(the index's best match), decayed per request so it follows a change of traffic within about
`memory` requests. The policy weighs the home by it: near 1 when prompts are mostly prefixes
seen before (multi-turn chat, shared documents, Spark rows of one text), near 0 when nothing
repeats. It starts from a prior of a few fully held prompts, so a fresh router keeps its homes
until traffic shows otherwise. Routers of one fleet see the same traffic mix and arrive at
about the same share; the share only scales the home's worth, never moves the home.
"""

from __future__ import annotations

import threading

# The prior: four prompts of 512 tokens, all held. A few misses in a row (every fleet starts
# with them: each tenant's first document) should not yet take the homes away; ten unique
# prompts of ~800 tokens bring the share under 0.2.
PRIOR_TOKENS = 4 * 512
MEMORY = 64          # requests: each new one weighs 1/MEMORY against what came before


class PrefixReuse:
    def __init__(self, *, memory: int = MEMORY, prior_tokens: int = PRIOR_TOKENS) -> None:
        self._keep = 1.0 - 1.0 / memory
        self._held = float(prior_tokens)
        self._seen = float(prior_tokens)
        self._lock = threading.Lock()   # routers tokenize on threads (stream.py): no update lost

    @property
    def share(self) -> float:
        """Of the recent prompt tokens, the decayed share some worker held on arrival (0..1)."""
        with self._lock:
            return self._held / self._seen if self._seen > 0 else 1.0

    def add(self, held_tokens: int, prompt_tokens: int) -> None:
        """A prompt of `prompt_tokens` arrived with `held_tokens` of it held by the best worker."""
        if prompt_tokens <= 0:
            return
        held = min(max(held_tokens, 0), prompt_tokens)
        with self._lock:
            self._held = self._held * self._keep + held
            self._seen = self._seen * self._keep + prompt_tokens
