"""CacheMatch: what the router's cache index answered for one prompt, cache_aware's own input.

`CacheRouting.match` (router/cache/routing.py) makes one per request, before the first pick; the
cache hook (router/cache/hook.py) keeps it with the prompt and hands it to the stream, which
passes it to the policy (`Policy.rank(features, snapshot, cache)`) and counts the prompt tokens a
worker holds as tokens its lease will not prefill. A request the index knows nothing of (another
policy, or its ids not known yet) has none, which weighs as NOTHING_HELD: every worker holds
nothing, and there is no frontier to find a home by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CacheMatch:
    """Who holds the prompt's leading blocks, and where a prompt nobody holds goes. `cached_tokens`
    is read-only by convention, like the rest."""

    # worker address -> leading prompt tokens that worker holds in its KV cache (absent: none, or unknown)
    cached_tokens: Mapping[str, int] = field(default_factory=dict, hash=False)
    # the key of the prompt's first block that no worker holds (its last block when every block is
    # held somewhere); its point on the hash ring is where a miss goes ("" = none)
    frontier_key: str = ""
    # of the new parts of recent mostly-new prompts, the share later prompts reused
    # (router/cache/prefix_reuse.py); a prompt's home is worth that share of what it would keep cached
    prefix_reuse: float = 1.0

    def held(self, address: str) -> int:
        """Leading prompt tokens `address` holds (0: none, or unknown)."""
        return self.cached_tokens.get(address, 0)


NOTHING_HELD = CacheMatch()
