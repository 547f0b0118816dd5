"""One worker's entries in the cache index (WorkerEntries): the blocks it holds, by our key.

The index (index.py) keeps one per worker that sent events or was routed to, and the speculative
half of it (routed_holds.py) works on the same record; it lives here so that both import it and
neither imports the other. It has no behaviour of its own: the index changes it under its lock.
"""

from __future__ import annotations


class WorkerEntries:
    """A worker's entries: real ones (`held`, from its events) and speculative ones (`speculative`:
    ttl running; `pending`: the routed request has no first token yet)."""

    __slots__ = ("address", "bit", "model", "epoch", "sequence", "synced", "applied_at", "held", "by_engine",
                 "speculative", "pending")

    def __init__(self, address: str, bit: int, model: str) -> None:
        self.address = address
        self.bit = bit
        self.model = model
        self.epoch: str | None = None
        self.sequence = 0
        self.synced = False
        self.applied_at = float("-inf")
        self.held: dict[int, bytes] = {}          # our key -> engine hash, least recently stored/routed first
        self.by_engine: dict[bytes, int] = {}     # engine hash -> our key
        self.speculative: dict[int, float] = {}   # our key -> expiry, in the order their ttl started
        # our key -> [requests holding it that have no first token yet, expiry once they are done]:
        # a key is in at most one of held, speculative and pending.
        self.pending: dict[int, list] = {}

    @property
    def entries(self) -> int:
        return len(self.held) + len(self.speculative) + len(self.pending)
