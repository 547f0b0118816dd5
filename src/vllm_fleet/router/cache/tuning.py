"""Cache-aware routing's internal constants: measured once, not set per fleet.

A user sets `--policy cache_aware` and at most three knobs (RouterConfig's cache_load_weight,
cache_index_max_entries, cache_home_tokens). Everything else the policy and CacheRouting use is
here, with the default the runs chose; benchmarks/RESULTS.md ("Cache-aware routing's internal
constants") names the figure behind each. RouterConfig holds one as `cache_tuning`, which the
command line does not expose: tests and benchmarks set it in code, Spark jobs in their router
JSON ({"cache_tuning": {...}}).
"""

from __future__ import annotations

from pydantic import Field

from vllm_fleet.config import FleetModel


class CacheTuning(FleetModel):
    """The constants of cache-aware routing that no deployment is expected to change."""

    prefill_weight: float = Field(
        1.0, ge=0, description="Cost of one prompt token a worker would still have to prefill (the prompt less "
        "the leading tokens its KV cache holds); the unit the other weights are measured in"
    )
    queued_tokens: int = Field(
        256, ge=0, description="Tokens of load counted for each sequence a worker reports running or waiting "
        "beyond this router's own (other gateways' work, whose size is unknown here)"
    )
    load_bound: float | None = Field(
        1.25, ge=1, description="A worker whose load is above this times the mean load (this request included) "
        "goes after all others, whatever it holds, so a hot prefix cannot pile onto one worker; None: no bound"
    )
    home_balance: float | None = Field(
        1.1, ge=1, description="A prompt's home is the first worker on its hash ring whose KV cache fill is at "
        "most this times the workers' mean, so new prefixes fill the emptier caches; None: the ring alone"
    )
    home_by_reuse: bool = Field(
        True, description="Weigh a prompt's home by the share of recent new prompts whose new part a later "
        "prompt reused, so where nothing comes back a miss goes to the least loaded; False: full home tokens"
    )
    copy_weight: float = Field(
        1.0, ge=0, description="Extra cost of one prompt token a worker would prefill that another worker's KV "
        "cache already holds (a copy takes cache room and evicts another prefix); 0: its prefill only"
    )
    speculative_ttl_s: float = Field(
        2.0, gt=0, description="A prompt routed to a worker counts as cached there while it prefills, and for "
        "this long after its first token, until the worker's KV events confirm it"
    )
    head_chars: int = Field(
        250, ge=0, description="A new text piece over twice this many characters is tokenized head first for "
        "the decision (the rest after the pick); its ids then do not go to the worker. 0: whole"
    )
    send_prompt_ids: bool = Field(
        True, description="Send the prompt's token ids to workers that take them (worker --accept-router-ids, "
        "same tokenizer files), so they skip rendering it"
    )
