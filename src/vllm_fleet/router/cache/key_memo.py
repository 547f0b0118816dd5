"""A bounded memo of block-key hashes: hash input -> key, for prompts whose blocks come back.

Why: most long prompts a router keys share most of their blocks with one it keyed shortly before
(a tenant's system prompt or document, the earlier turns of a conversation), and the engines'
stored events repeat the blocks of prompts routed. Chaining a key costs a blake2b per block
(~0.7 us on the 2-core VM, ~95 us for a 2,000-token prompt in 16-token blocks); a dict hit on
the hash's input costs under half of that in a loop, less of a gain inside a decision, whose
tokenizing leaves the memo out of the CPU's caches (benchmarks/router_decision.py, block keys
P50: shared 99 -> 68 us, next-turn 105 -> 87 us; results/router-decision-2026-12-04b). A key is a pure function of its input (the previous key
and the block's ids, block_keys.chain_keys), so a hit is exactly the hash: keys never change.

Bound: two generations of at most `max_entries` inputs each. When the recent one is full it
becomes the older one and the one before goes, all at once (O(1)); an input found in the older
one moves back to the recent one, so blocks in use survive a burst of new prompts. An entry is
its input (8 + 4 x block size bytes), its 8-byte key and the dict's slot: ~190 bytes for blocks of
16 tokens, ~12 MB for the default 2 x 32,768; ~40 MB for blocks of 128.

Thread-safety: readers and writers on any threads; a race can only drop an entry or store the
same value twice (values are pure functions of their inputs), never return a wrong one.
"""

from __future__ import annotations

MAX_ENTRIES = 32_768


class KeyMemo:
    """hash input (bytes) -> cut key (8 bytes). `recent` and `older` are read by the hot loop."""

    __slots__ = ("max_entries", "recent", "older")

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.recent: dict[bytes, bytes] = {}
        self.older: dict[bytes, bytes] = {}

    def trim(self) -> None:
        """Called after each prompt's chain: the recent generation, once full, becomes the older."""
        if len(self.recent) > self.max_entries:
            self.older, self.recent = self.recent, {}

    def clear(self) -> None:
        self.recent, self.older = {}, {}
