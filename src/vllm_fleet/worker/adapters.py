"""The LoRA adapters one worker holds: names, engine ids, checks, LRU order, running requests.

The engine's adapter slots (vLLM's max_loras) are the registry's slots: a load into a full
worker evicts the least recently used adapter that no request is running on; with every
adapter busy the load is refused for capacity (RESOURCE_EXHAUSTED), and the router tries
another worker. A folder is checked before the engine sees it (it exists, its
adapter_config.json reads, its rank is within --max-lora-rank), so a bad path or rank is a
400 naming the field rather than an engine error.

An unload stops new requests for the adapter at once (they are refused for capacity, so a
router sends them elsewhere or loads the adapter again), waits for the requests running on
it to finish, then removes it from the engine: no running request is lost.

Errors raised here (service.py maps them): InvalidRequestError naming `lora_name`,
`lora_path` or `rank`; DuplicateRequestError for a name held with another path;
UnknownModelError for an unload of a name not held; WorkerOverloadedError for a full worker
or a request for an adapter not held (or being unloaded) here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    UnknownModelError,
    WorkerOverloadedError,
)
from vllm_fleet.protocol.types import Adapter

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class HeldAdapter:
    """One adapter loaded in the engine. `lora_id` is the engine's id (vLLM's lora_int_id)."""

    name: str
    path: str
    rank: int
    lora_id: int
    last_used: float = 0.0
    running: int = 0
    unloading: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


EngineCall = Callable[[HeldAdapter], Awaitable[None]]


def adapter_rank(path: str, max_rank: int) -> int:
    """The rank of the PEFT adapter folder at `path`; InvalidRequestError if it cannot be used."""
    folder = Path(path)
    config_file = folder / "adapter_config.json"
    if not path or not folder.is_dir():
        raise InvalidRequestError(f"lora_path {path!r} is not a folder on this worker", param="lora_path")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"lora_path {path!r} has no readable adapter_config.json (a PEFT adapter "
                                  f"folder has one): {exc}", param="lora_path") from None
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or rank < 1:
        raise InvalidRequestError(f"lora_path {path!r}: adapter_config.json has no rank 'r'", param="lora_path")
    if rank > max_rank:
        raise InvalidRequestError(f"adapter rank {rank} is above this worker's limit {max_rank} "
                                  f"(--max-lora-rank)", param="rank")
    return rank


class AdapterRegistry:
    """Adapters held by one worker. `slots` 0 means LoRA is off. Runs on the worker's loop."""

    def __init__(self, slots: int, max_rank: int, base_model: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = slots
        self.max_rank = max_rank
        self._base_model = base_model
        self._clock = clock
        self._held: dict[str, HeldAdapter] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()  # one load or eviction at a time: slots are counted under it
        self.loads = 0               # engine loads since start (a burst for one adapter adds one)

    def names(self) -> list[str]:
        """Adapters requests may use now (not those being unloaded), as Load reports them."""
        return [a.name for a in self._held.values() if not a.unloading]

    def listing(self) -> list[Adapter]:
        base = self._base_model()
        return [Adapter(a.name, a.path, a.rank, base) for a in self._held.values() if not a.unloading]

    # --- requests ---------------------------------------------------------------------------

    def acquire(self, name: str) -> HeldAdapter:
        """A request starts on adapter `name`; release() it when the request ends."""
        if not self.slots:
            raise InvalidRequestError(f"model {name!r}: this worker serves no LoRA adapters "
                                      f"(start it with --lora or --max-loras)", param="model")
        held = self._held.get(name)
        if held is None or held.unloading:
            raise WorkerOverloadedError(f"adapter {name!r} is not loaded on this worker; load it first")
        held.running += 1
        held.last_used = self._clock()
        held.idle.clear()
        return held

    def release(self, held: HeldAdapter) -> None:
        held.running -= 1
        held.last_used = self._clock()
        if held.running == 0:
            held.idle.set()

    # --- load and unload ----------------------------------------------------------------------

    async def load(self, name: str, path: str, add: EngineCall, remove: EngineCall) -> HeldAdapter:
        """Load `name` from `path` into the engine (`add`), evicting the LRU idle adapter when full."""
        if not self.slots:
            raise InvalidRequestError("this worker serves no LoRA adapters (start it with --max-loras N)",
                                      param="lora_name")
        if not name:
            raise InvalidRequestError("lora_name is empty", param="lora_name")
        rank = adapter_rank(path, self.max_rank)
        async with self._lock:
            held = self._held.get(name)
            if held is not None and not held.unloading:
                if held.path == path:
                    return held  # loading what is loaded is a no-op: routers may race to place it
                raise DuplicateRequestError(f"adapter {name!r} is already loaded from {held.path!r}; "
                                            f"unload it first")
            if held is not None:
                await held.idle.wait()  # its unload finishes first; the name is then free
            if len(self._held) >= self.slots:
                await self._evict(remove)
            held = HeldAdapter(name, path, rank, next(self._ids), last_used=self._clock())
            started = time.perf_counter()
            await add(held)
            self._held[name] = held
            self.loads += 1
            logger.info("adapter %s loaded from %s (rank %d) in %.2fs", name, path, rank,
                        time.perf_counter() - started)
            return held

    async def _evict(self, remove: EngineCall) -> None:
        idle = [a for a in self._held.values() if a.running == 0 and not a.unloading]
        if not idle:
            raise WorkerOverloadedError(f"all {self.slots} adapter slots of this worker run requests; "
                                        f"try another worker")
        victim = min(idle, key=lambda a: a.last_used)
        logger.info("adapter %s evicted (least recently used) for a new one", victim.name)
        del self._held[victim.name]
        await remove(victim)

    async def unload(self, name: str, remove: EngineCall) -> None:
        """Stop new requests on `name`, wait for its running ones, then remove it from the engine."""
        held = self._held.get(name)
        if held is None or held.unloading:
            raise UnknownModelError(f"adapter {name!r} is not loaded on this worker", model=name)
        held.unloading = True
        if held.running:
            logger.info("adapter %s: unloading once its %d running request(s) finish", name, held.running)
        await held.idle.wait()
        if self._held.get(name) is held:
            del self._held[name]
        await remove(held)
        logger.info("adapter %s unloaded", name)
