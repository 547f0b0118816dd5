"""The fleet-wide bucket of one key, as pure functions over the state stored in the coordinator.

The state is `{"requests": level, "tokens": level, "at": wall-clock seconds, "limits": {...}}`: the same token
bucket a single gateway keeps (router/quota/admission.py), holding one minute's worth and refilling
at limit/60 per second, only shared. No state (a new key) is a full bucket. Gateways never
spend from it directly: they take *leases* (`lease`) that they spend locally, and hand back
what they did not use (`give_back`). The store applies these functions under compare-and-set,
so two gateways never both take the last of a bucket.

The state keeps the limits it was written under: when a reload changes a key's limit, the
level keeps what was used of the old one (as a local bucket's `resized` does), so a change of
limit is never a free refill.

`at` is wall-clock time because gateways on different hosts share it; a gateway whose clock is
behind sees no refill rather than negative time (`at` never moves backwards).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.router.config import KeyLimits

DIMENSIONS = (("requests", "requests_per_min"), ("tokens", "tokens_per_min"))


@dataclass(frozen=True, slots=True)
class Amount:
    """Requests and tokens, of a lease or of a key's local balance."""

    requests: float = 0.0
    tokens: float = 0.0

    def get(self, name: str) -> float:
        return self.requests if name == "requests" else self.tokens


@dataclass(frozen=True, slots=True)
class Lease:
    """The answer to a lease: `granted` (None when refused), and the shared levels after it."""

    granted: Amount | None
    levels: Amount
    retry_after: float = 0.0     # refused: seconds until the amount needed fits
    reason: str = ""             # refused: "requests_per_min" or "tokens_per_min"


def refilled(state: dict | None, limits: KeyLimits, now: float) -> dict[str, float]:
    """The levels at `now`: refilled by the time passed since the state was written."""
    if state is None:
        return {"requests": limits.requests_per_min or 0.0, "tokens": limits.tokens_per_min or 0.0, "at": now}
    at = float(state.get("at", now))
    elapsed = max(0.0, now - at)
    written_under = state.get("limits", {})
    levels = {"at": max(at, now)}
    for name, field in DIMENSIONS:
        capacity = getattr(limits, field)
        if not capacity:
            levels[name] = 0.0
            continue
        level = float(state.get(name, capacity))
        if (old := written_under.get(name)) and old != capacity:
            level = capacity - (old - level)   # keep what was used of the old limit
        levels[name] = min(capacity, level + elapsed * capacity / 60.0)
    return levels


def _stored(levels: dict[str, float], limits: KeyLimits) -> dict:
    return {**levels, "limits": {name: getattr(limits, field) for name, field in DIMENSIONS}}


def lease(state: dict | None, limits: KeyLimits, now: float, need: Amount, want: Amount) -> tuple[dict | None, Lease]:
    """Take between `need` and `want` of each limited dimension, or nothing.

    Granted when every limited level holds `need` (or, for a need above the whole limit, when
    the bucket is full: such a request leaves it in debt, as a local bucket does). The grant is
    as much of `want` as the level holds, never less than `need`. Returns the new state (None:
    nothing to write) and the Lease."""
    levels = refilled(state, limits, now)
    waits = {}
    for name, field in DIMENSIONS:
        capacity = getattr(limits, field)
        if capacity and (missing := min(need.get(name), capacity) - levels[name]) > 1e-9:
            waits[field] = missing / (capacity / 60.0)
    if waits:
        reason = max(waits, key=waits.get)
        return None, Lease(None, _amount(levels), retry_after=waits[reason], reason=reason)
    granted = {}
    for name, field in DIMENSIONS:
        if getattr(limits, field):
            granted[name] = max(need.get(name), min(want.get(name), max(0.0, levels[name])))
            levels[name] -= granted[name]
        else:
            granted[name] = want.get(name)  # unlimited: nothing shared to take
    if not any(granted[name] for name, field in DIMENSIONS if getattr(limits, field)):
        return None, Lease(Amount(), _amount(levels))  # an empty bucket and nothing needed: no write
    return _stored(levels, limits), Lease(Amount(**granted), _amount(levels))


def give_back(state: dict | None, limits: KeyLimits, now: float, amount: Amount) -> tuple[dict | None, Lease]:
    """Return unspent lease to the shared bucket (never above its limit)."""
    levels = refilled(state, limits, now)
    for name, field in DIMENSIONS:
        if capacity := getattr(limits, field):
            levels[name] = min(capacity, levels[name] + max(0.0, amount.get(name)))
    return _stored(levels, limits), Lease(amount, _amount(levels))


def _amount(levels: dict[str, float]) -> Amount:
    return Amount(levels["requests"], levels["tokens"])
