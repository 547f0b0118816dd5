"""Router settings: one pydantic model for routing and fault handling, one for admission.

`add_router_options(parser)` adds every setting as a CLI option (the gateway and the bench
call it), and `router_config_from_args(args)` builds the `RouterConfig` back, so each option
is written once, here. Cache-aware routing's internal constants (`cache_tuning`,
router/cache/tuning.py) are the exception: set in code, never on the command line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

from pydantic import Field

from vllm_fleet.config import FleetModel, add_options, from_args, validated
from vllm_fleet.errors import ConfigError
from vllm_fleet.router.cache.tuning import CacheTuning
from vllm_fleet.router.classes.service_class import ServiceClassConfig

PolicyName = Literal[
    "least_outstanding", "power_of_two", "session_affinity", "prefix_affinity", "round_robin", "cache_aware",
]


class KeyLimits(FleetModel):
    """Budgets of one API key. None means unlimited. Each bucket holds one minute's worth."""

    requests_per_min: float | None = Field(None, gt=0, description="Requests a key may start per minute")
    tokens_per_min: float | None = Field(
        None, gt=0, description="Tokens (prompt estimate + max_tokens, settled with real usage) a key may use per minute"
    )


class AdmissionConfig(FleetModel):
    """Per-key token buckets and workload classes (short / long) with bounded queues."""

    default: KeyLimits = Field(default_factory=KeyLimits, description="Limits of every key without an override")
    keys: dict[str, KeyLimits] = Field(default_factory=dict, description="Per-key overrides of the default limits")
    long_prompt_tokens: int = Field(
        2048, ge=1, description="A request whose prompt estimate reaches this many tokens is of class 'long'"
    )
    long_max_tokens: int = Field(1024, ge=1, description="A request asking for this many output tokens or more is 'long'")
    short_max_in_flight: int | None = Field(
        None, ge=1, description="Most 'short' requests running at once; more wait in the short queue (unset: no limit)"
    )
    long_max_in_flight: int | None = Field(
        None, ge=1, description="Most 'long' requests running at once; more wait in the long queue (unset: no limit)"
    )
    short_queue_size: int = Field(256, ge=0, description="Most 'short' requests waiting; a full queue rejects (429)")
    long_queue_size: int = Field(64, ge=0, description="Most 'long' requests waiting; a full queue rejects (429)")
    queue_timeout_s: float = Field(10.0, ge=0, description="How long a request may wait in its class queue")
    class_pools: bool = Field(
        False,
        description="Route each class only to workers whose pool (worker --pool, or the fleet file) is 'short' or "
        "'long' (workers without a pool serve both)",
    )
    class_pool_fallback: bool = Field(
        False, description="With --class-pools: when a class's pool has no serving worker of the model (nor one "
        "without a pool), use another pool's workers instead of failing with no worker (off: pools stay apart)",
    )
    fleet_quota: str | None = Field(
        None, description="zk://host:port[,host:port]/cluster: per-key limits hold for all gateways given the same "
        "URL together, through leases from ZooKeeper (unset: each gateway enforces them on its own)",
    )
    fleet_quota_lease_fraction: float = Field(
        0.1, gt=0, le=1, description="Fleet quota: a gateway leases at most this fraction of a key's limit divided by "
        "the number of gateways at a time; bounds what idle gateways hold unspent (under-admission)",
    )
    fleet_quota_lease_wait_s: float = Field(
        1.0, gt=0, description="Fleet quota: longest a request waits for a lease before this gateway falls back to "
        "its share of the limit (limit / gateways)",
    )
    fleet_quota_idle_return_s: float = Field(
        10.0, gt=0, description="Fleet quota: a key unused on this gateway this long gives its unspent lease back",
    )

    def limits_for(self, key: str) -> KeyLimits:
        return self.keys.get(key, self.default)

    @property
    def limits_keys(self) -> bool:
        """Whether any key budget is set at all (otherwise keys are not tracked)."""
        return any(l.requests_per_min or l.tokens_per_min for l in (self.default, *self.keys.values()))


class RouterConfig(FleetModel):
    """How the router picks workers, watches them, and recovers from their failures."""

    policy: PolicyName = Field("least_outstanding", description="Routing policy")
    load_poll_interval_s: float = Field(
        0.5, gt=0, description="How often each worker's Load comes: pushed by the worker over its stream call, or "
                               "polled from a worker that does not push")
    health_poll_interval_s: float = Field(
        1.0, gt=0, description="How often a worker's gRPC health is asked when no fresh Load carried it (from "
                               "workers that predate the field, or whose Loads get no answer); at most once per "
                               "Load interval")
    stall_timeout_s: float = Field(
        5.0, gt=0, description="A stream with no chunk for this long moves to another worker only if its worker "
        "is not SERVING or its engine has shown no progress (no output, no CPU) for as long by the worker's own "
        "account; a stream queued on a busy engine waits as long as the engine steps"
    )
    first_chunk_timeout_s: float = Field(
        60.0, gt=0, description="As --stall-timeout-s, before a request's first chunk (prefill included): how "
        "long its worker's engine may show no progress before the request fails over"
    )
    max_attempts: int = Field(3, ge=1, description="Most workers one request may try (failovers and migrations included)")
    retry_budget_ratio: float = Field(
        0.2, ge=0, description="Retries (failovers and migrations) allowed as a fraction of recent requests"
    )
    retry_budget_min_per_s: float = Field(
        10.0, ge=0, description="Retries per second always allowed on top of the ratio, so a quiet pool can still retry"
    )
    retry_budget_window_s: float = Field(10.0, gt=0, description="Window over which the retry budget counts requests")
    breaker_failures: int = Field(5, ge=1, description="Consecutive failures that open a worker's circuit breaker")
    breaker_open_s: float = Field(5.0, gt=0, description="How long an open breaker keeps a worker out before a probe")
    breaker_successes: int = Field(2, ge=1, description="Successful probes that close a half-open breaker")
    ejection_failure_ratio: float = Field(
        0.5, gt=0, le=1, description="Outlier ejection: a worker failing this share of its recent requests is ejected"
    )
    ejection_min_requests: int = Field(10, ge=1, description="Outlier ejection: fewest recent requests to judge a worker")
    ejection_window_s: float = Field(30.0, gt=0, description="Outlier ejection: how far back requests count")
    ejection_base_s: float = Field(10.0, gt=0, description="Outlier ejection: first ejection length (doubles on repeats)")
    ejection_max_ratio: float = Field(
        0.5, ge=0, le=1, description="Largest share of a model's workers out of rotation at once (outlier ejection "
        "and open circuit breakers together); a model's last worker is never taken out"
    )
    affinity_load_bound: float | None = Field(
        1.25, ge=1, description="Session/prefix affinity: a worker takes at most this times the mean in-flight load "
        "(of this router's requests); null: no bound, a key leaves its worker only when that worker stops serving"
    )
    prefix_chars: int = Field(256, ge=1, description="Prefix affinity: characters (or tokens) of the prompt hashed")
    cache_load_weight: float = Field(
        0.25, ge=0, description="Cache-aware routing: cost of one token of load on a worker (its outstanding "
        "tokens of this router's requests, plus a fixed guess per other sequence it runs or queues) against one "
        "prompt token it would prefill; raise it to spread load over saving prefill"
    )
    cache_home_tokens: int = Field(
        512, ge=0, description="Cache-aware routing: tokens of cost added on every worker but a prompt's home "
        "(the worker its first block held nowhere hashes to), so a prefix no worker holds goes to one place "
        "and the workers' caches split the prefixes instead of copying them; 0: for a fleet whose prompts "
        "share nothing, the least loaded takes a miss"
    )
    cache_index_max_entries: int = Field(
        10_000_000, ge=1, description="Cache-aware routing: most (worker, KV block) entries the router's cache "
        "index keeps (about 210 bytes each); past it, it forgets the blocks least recently stored or routed "
        "of the worker holding most"
    )
    default_max_tokens: int = Field(
        256, ge=1, description="Output tokens assumed for load and budgets when a request sets no max_tokens"
    )
    cache_tuning: CacheTuning = Field(
        default_factory=CacheTuning, description="Cache-aware routing's internal constants (router/cache/tuning.py; "
        "not on the command line: their measured defaults are in benchmarks/RESULTS.md)")
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig, description="Key budgets and workload classes")
    classes: ServiceClassConfig = Field(
        default_factory=ServiceClassConfig, description="How batch-class requests share workers with interactive ones")


def add_router_options(parser: argparse.ArgumentParser) -> None:
    """Add the routing options (one group) and the admission options (another)."""
    routing = parser.add_argument_group("routing")
    add_options(routing, RouterConfig, skip=("admission", "classes", "cache_tuning"))
    add_options(parser.add_argument_group("service classes (interactive, batch)"), ServiceClassConfig)
    admission = parser.add_argument_group("admission")
    add_options(admission, KeyLimits, prefix="key_")
    admission.add_argument(
        "--key-limits", dest="key_limits", default=argparse.SUPPRESS, metavar="JSON|@FILE",
        help='Per-key overrides, e.g. \'{"team-a": {"requests_per_min": 600}}\', or @path to such a JSON file',
    )
    add_options(admission, AdmissionConfig, skip=("default", "keys"))


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Build the RouterConfig from options added by `add_router_options` (only those given)."""
    keys = _parse_key_limits(getattr(args, "key_limits", None))
    admission = from_args(AdmissionConfig, args, default=from_args(KeyLimits, args, prefix="key_"), keys=keys)
    return from_args(RouterConfig, args, admission=admission, classes=from_args(ServiceClassConfig, args))


def _parse_key_limits(value: str | None) -> dict[str, KeyLimits]:
    if not value:
        return {}
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            raise ConfigError(f"--key-limits: cannot read {value[1:]}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--key-limits: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise ConfigError('--key-limits: expected an object like {"key": {"requests_per_min": 60}}')
    limits = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            raise ConfigError(f'--key-limits: the limits of key {key!r} must be an object like {{"requests_per_min": 60}}')
        limits[str(key)] = validated(KeyLimits, value)
    return limits
