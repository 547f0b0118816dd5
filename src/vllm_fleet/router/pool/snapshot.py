"""An immutable view of the pool at one instant: what policies rank and what /ready shows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from vllm_fleet.protocol.types import WorkerLoad

# Worker states, from best to worst.
SERVING = "serving"      # health SERVING, Info known, not ejected: takes new requests
DRAINING = "draining"    # the worker says it is draining: finishes its streams, takes nothing new
EJECTED = "ejected"      # the router took it out (outlier ejection); back after a while
DOWN = "down"            # health NOT_SERVING / UNREACHABLE, or Info not fetched yet

# Breaker states.
CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"


def serves(worker, model: str | None, pool: str | None) -> bool:
    """Whether `worker` (anything with `model` and `pool`) serves `model` (any if None) in class
    pool `pool`: a worker without a pool serves any."""
    return (model is None or worker.model == model) and (not pool or not worker.pool or worker.pool == pool)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as the router sees it now."""

    address: str
    model: str = ""
    pool: str = ""                    # the worker's pool (workload class: Info, else its registry record), "" = any
    state: str = SERVING
    breaker: str = CLOSED
    health: str = "SERVING"           # last gRPC health answer
    load: WorkerLoad | None = None    # last Load answer (None until the first poll)
    in_flight: int = 0                # requests this router has open on it
    outstanding_tokens: int = 0       # prompt + output tokens still expected of those requests
    max_model_len: int = 0
    max_num_seqs: int = 0             # the engine's sequence slots (Info); 0 = not said
    schedules_by_priority: bool = False  # the engine runs vLLM's priority scheduling (Info)
    batch_in_flight: int = 0          # of `in_flight`, this router's batch-class requests
    kv_events_fresh: bool = False     # the cache index follows its KV events, in order and lately:
                                      # cache-aware routing may count its cached tokens
    cache_events: str = ""            # cache_aware: "in step", "stale" or "off" (no events); "" other policies
    predicted_hit_rate: float | None = None  # cache_aware: cached share of the prompts routed here, as predicted
    copied_share: float | None = None  # cache_aware: share of them another worker held more of (spent for load)
    cache_blocks: int = 0             # cache_aware: KV blocks the index holds for it (speculative ones too)
    kv_blocks: int = 0                # its KV cache's size in blocks (Info); 0 = not said

    @property
    def routable(self) -> bool:
        """May take a new request (a half-open breaker admits its probe at dispatch time)."""
        return self.state == SERVING and self.breaker != OPEN

    @property
    def queued(self) -> int:
        """The worker's own count of running + waiting sequences (all routers' work)."""
        return 0 if self.load is None else self.load.running + self.load.waiting

    def to_dict(self) -> dict:
        load = self.load
        return {
            "address": self.address, "model": self.model, "pool": self.pool, "state": self.state,
            "breaker": self.breaker, "health": self.health, "in_flight": self.in_flight,
            "outstanding_tokens": self.outstanding_tokens, "max_model_len": self.max_model_len,
            "batch_in_flight": self.batch_in_flight, "interactive_in_flight": self.in_flight - self.batch_in_flight,
            "kv_events_fresh": self.kv_events_fresh,
            "cache": None if not self.cache_events else {
                "events": self.cache_events, "predicted_hit_rate": self.predicted_hit_rate,
                "copied_share": self.copied_share, "blocks": self.cache_blocks, "kv_blocks": self.kv_blocks or None,
                "engine_hit_rate": (load.prefix_cache_hits / load.prefix_cache_queries
                                    if load is not None and load.prefix_cache_queries else None),
            },
            "load": None if load is None else {
                "running": load.running, "waiting": load.waiting, "kv_cache_usage": load.kv_cache_usage,
                "prefix_cache_hit_rate": load.prefix_cache_hit_rate,
                "output_tokens_per_s": load.output_tokens_per_s, "draining": load.draining,
            },
        }


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Every known worker, sorted by address. Build new ones; never change one."""

    workers: tuple[WorkerView, ...] = ()
    taken_at: float = 0.0
    _by_address: dict[str, WorkerView] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.workers, key=lambda w: w.address))
        object.__setattr__(self, "workers", ordered)
        object.__setattr__(self, "_by_address", {w.address: w for w in ordered})

    def __iter__(self) -> Iterator[WorkerView]:
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def get(self, address: str) -> WorkerView | None:
        return self._by_address.get(address)

    def models(self) -> list[str]:
        """Models with at least one serving worker."""
        return sorted({w.model for w in self.workers if w.state == SERVING and w.model})

    def known_models(self) -> list[str]:
        """Models of every worker whose Info is known, whatever its state."""
        return sorted({w.model for w in self.workers if w.model})

    def eligible(self, model: str | None = None, pool: str | None = None) -> list[WorkerView]:
        """Routable workers of `model` (any if None) in `pool` (workers without a pool serve any)."""
        return [
            w for w in self.workers if w.routable and serves(w, model, pool)
        ]

    def in_panic(self, model: str | None = None, pool: str | None = None) -> PoolSnapshot | None:
        """Panic mode (Envoy's): when no worker of `model` in `pool` is routable but some are up
        (health SERVING, only out by their breaker or ejection), the snapshot a policy ranks them
        in, all shown routable; None otherwise. Failures everywhere then slow requests down
        instead of refusing every one."""
        if self.eligible(model, pool):
            return None
        up = [w for w in self.workers if w.state in (SERVING, EJECTED) and serves(w, model, pool)]
        if not up:
            return None
        return PoolSnapshot(tuple(replace(w, state=SERVING, breaker=CLOSED) for w in up), self.taken_at)

    def to_dict(self) -> dict:
        return {"taken_at": self.taken_at, "workers": [w.to_dict() for w in self.workers]}
