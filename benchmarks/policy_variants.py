"""Our routing policies under other settings, by the name a bench's --policies gives them."""

from __future__ import annotations

# label -> (policy, RouterConfig fields for an in-process Router, arguments for a gateway process).
# cache_aware_ring: a new prefix's home by the hash ring alone, as before --cache-home-balance.
# cache_aware_full_home: a home always worth its full tokens, as before --cache-home-by-reuse.
POLICY_VARIANTS = {
    "cache_aware_ring": ("cache_aware", {"cache_home_balance": None}, ["--cache-home-balance", "none"]),
    "cache_aware_full_home": ("cache_aware", {"cache_home_by_reuse": False}, ["--no-cache-home-by-reuse"]),
}


def our_policy(label: str) -> tuple[str, dict, list[str]]:
    """(policy name, RouterConfig fields, gateway arguments) for a --policies label."""
    return POLICY_VARIANTS.get(label, (label, {}, []))
