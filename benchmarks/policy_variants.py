"""Our routing policies under other settings, by the name a bench's --policies gives them."""

from __future__ import annotations

from vllm_fleet.router.cache.tuning import CacheTuning

# label -> (policy, RouterConfig fields for an in-process Router, arguments for a gateway process,
# or None where the variant changes one of cache_aware's internal constants, which the gateway's
# command line does not take: router/cache/tuning.py).
# cache_aware_ring: a new prefix's home by the hash ring alone, as before the home balance.
# cache_aware_full_home: a home always worth its full tokens, as before the home was weighed by reuse.
POLICY_VARIANTS = {
    "cache_aware_ring": ("cache_aware", {"cache_tuning": CacheTuning(home_balance=None)}, None),
    "cache_aware_full_home": ("cache_aware", {"cache_tuning": CacheTuning(home_by_reuse=False)}, None),
}


def our_policy(label: str) -> tuple[str, dict, list[str] | None]:
    """(policy name, RouterConfig fields, gateway arguments or None) for a --policies label."""
    return POLICY_VARIANTS.get(label, (label, {}, []))
