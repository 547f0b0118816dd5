"""Adapter-aware placement (#16): which workers a LoRA request may run on, and loading it there.

The fleet's adapter catalog is name → (path, base model): adapters registered through the
admin endpoint, plus those workers report holding in Load (their --lora adapters; path
unknown until one is registered). A request whose model is an adapter runs on its base
model's workers that hold it. When none does, `place` loads it on one worker: the least
loaded (router in-flight + the worker's queue) among those with a free adapter slot, else the
least loaded of all (the worker then evicts its least recently used idle adapter, see
worker/adapters.py). One load per adapter at a time: a burst of requests for an adapter
that is not loaded anywhere waits on the same load (single flight).

What a worker holds is known from its Load answers; a load or unload we just did (whose
reply lists the adapters held) counts for `overlay_s` seconds over an older Load, and a
worker that refused a request for an adapter is taken not to hold it for that long. The path
of an adapter first seen in a Load is asked of that worker (ListAdapters) once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_fleet.errors import (
    FleetError,
    InvalidRequestError,
    NoWorkerError,
    UnknownModelError,
    WorkerError,
    WorkerOverloadedError,
)
from vllm_fleet.protocol.types import Adapter
from vllm_fleet.router.attempt_hooks import Attempt, AttemptHooks, HookedStream
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView

logger = logging.getLogger(__name__)


class AdapterClient(Protocol):
    """The part of a WorkerClient placement uses."""

    async def load_adapter(self, name: str, path: str) -> tuple[list[Adapter], int]: ...

    async def unload_adapter(self, name: str) -> tuple[list[Adapter], int]: ...

    async def list_adapters(self) -> tuple[list[Adapter], int]: ...


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str
    path: str   # "" when only known from a worker's Load (a --lora adapter)
    base: str


class AdapterPlacement:
    """The catalog and the placement of adapters over the pool. Use inside one event loop."""

    def __init__(self, snapshot: Callable[[], PoolSnapshot], connect: Callable[[str], AdapterClient], *,
                 overlay_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot = snapshot
        self._connect = connect
        self._overlay_s = overlay_s
        self._clock = clock
        self._registered: dict[str, CatalogEntry] = {}
        # Base models of adapters workers reported, kept after they leave: a request for one then
        # finds no holder and no path, a 404 from `place`, as for a name never seen. It spares
        # each request a scan of the pool (measured: half of what adapter routing cost).
        self._seen: dict[str, str] = {}
        self._overlay: dict[str, tuple[frozenset[str], float]] = {}  # address -> (held, until)
        self._loading: dict[str, asyncio.Future[str]] = {}
        self._learning: set[asyncio.Future] = set()
        self.loads = 0  # load RPCs this router sent (single flight: one per burst)

    # --- what is where --------------------------------------------------------------------

    def held_by(self, worker: WorkerView) -> frozenset[str]:
        overlay = self._overlay.get(worker.address)
        if overlay is not None and overlay[1] > self._clock():
            return overlay[0]
        return frozenset(worker.load.adapters) if worker.load is not None else frozenset()

    def catalog(self, snapshot: PoolSnapshot | None = None) -> dict[str, CatalogEntry]:
        """Every adapter the fleet knows: registered ones, then those only workers report."""
        entries = dict(self._registered)
        for worker in snapshot or self._snapshot():
            for name in self.held_by(worker):
                if name not in entries and worker.model:
                    entries[name] = CatalogEntry(name, "", worker.model)
                    if name not in self._seen:
                        self._seen[name] = worker.model
                        self._learn_soon(worker.address, name)
        return entries

    def _learn_soon(self, address: str, name: str) -> None:
        """Ask the worker that reported `name` for its path, so the adapter can be loaded on
        other workers (and shows its folder in /v1/models) even after that worker leaves."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        task = asyncio.ensure_future(self._learn(address, name))
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    async def _learn(self, address: str, name: str) -> None:
        try:
            held, _ = await self._connect(address).list_adapters()
        except FleetError as exc:
            logger.info("adapter %s: could not ask %s for its path: %s", name, address, exc)
            return
        for adapter in held:
            # Not if an unload came meanwhile (it forgot the name) or an admin registered it.
            if adapter.name == name and name in self._seen and name not in self._registered and adapter.path:
                self.remember(name, adapter.path, adapter.base_model or self._seen[name])

    def base_of(self, name: str) -> str | None:
        """The base model of adapter `name`, or None if the fleet knows no such adapter."""
        entry = self._registered.get(name)
        if entry is not None:
            return entry.base
        if name not in self._seen:
            self.catalog()
        return self._seen.get(name)

    def prefer_holders(self, name: str, ranked: Sequence[str], snapshot: PoolSnapshot) -> list[str]:
        """The ranked workers that hold `name`, in rank order (the policy's choice among them)."""
        return [a for a in ranked if (w := snapshot.get(a)) is not None and name in self.held_by(w)]

    def forget(self, address: str, name: str) -> None:
        """The worker refused a request for `name`: it does not hold it (any more)."""
        worker = self._snapshot().get(address)
        if worker is not None:
            self._note(address, self.held_by(worker) - {name})

    def _note(self, address: str, names) -> None:
        self._overlay[address] = (frozenset(names), self._clock() + self._overlay_s)

    # --- placement --------------------------------------------------------------------------

    async def place(self, name: str, base: str, pool: str | None = None) -> None:
        """Return once some routable worker of `base` holds `name`, loading it once if none does."""
        snapshot = self._snapshot()
        if any(name in self.held_by(w) for w in snapshot.eligible(base, pool)):
            return
        future = self._loading.get(name)
        if future is None:
            future = asyncio.ensure_future(self._load_somewhere(name, base, pool))
            self._loading[name] = future
            future.add_done_callback(lambda done: self._loading.pop(name, None) if self._loading.get(name)
                                     is done else None)
        await asyncio.shield(future)

    async def _load_somewhere(self, name: str, base: str, pool: str | None) -> str:
        entry = self.catalog().get(name)
        if entry is None or not entry.path:
            raise UnknownModelError(f"adapter {name!r} is not loaded on any worker and has no registered path; "
                                    f"load it with POST /v1/load_lora_adapter", model=name)
        return await self.load_on(name, entry.path, base, pool)

    async def load_on(self, name: str, path: str, base: str, pool: str | None = None) -> str:
        """Load `name` on the best worker of `base` (see the module doc); its address."""
        candidates = choose_workers(self._snapshot().eligible(base, pool), self.held_by)
        if not candidates:
            raise NoWorkerError(f"no serving worker of {base!r} takes LoRA adapters (start workers with "
                                f"--max-loras N)")
        last: FleetError | None = None
        for worker in candidates:
            self.loads += 1
            started = time.perf_counter()
            try:
                held, _ = await self._connect(worker.address).load_adapter(name, path)
            except InvalidRequestError:
                raise  # a bad path or rank is bad on every worker
            except WorkerError as exc:  # full of busy adapters, or gone: the next one
                logger.warning("adapter %s: load on %s failed: %s", name, worker.address, exc)
                last = exc
                continue
            self._note(worker.address, [a.name for a in held])
            logger.info("adapter %s loaded on %s in %.2fs", name, worker.address, time.perf_counter() - started)
            return worker.address
        raise NoWorkerError(f"no worker of {base!r} could load adapter {name!r}: {last}")

    # --- admin --------------------------------------------------------------------------------

    async def register(self, name: str, path: str, base: str) -> str:
        """Add `name` to the catalog and load it on one worker now, so a bad folder fails here."""
        known = self.catalog().get(name)
        if known is not None and known.path and known.path != path:
            raise InvalidRequestError(f"the adapter {name!r} is already loaded from {known.path!r}; unload it first",
                                      param="lora_name")
        address = await self.load_on(name, path, base)
        self.remember(name, path, base)
        return address

    def remember(self, name: str, path: str, base: str) -> None:
        """Put `name` in the catalog without loading it anywhere (its first request loads it)."""
        self._registered[name] = CatalogEntry(name, path, base)

    async def unregister(self, name: str) -> list[str]:
        """Drop `name` from the catalog and unload it from every worker holding it (each waits
        for its running requests); the workers it left."""
        snapshot = self._snapshot()
        if name not in self.catalog(snapshot):
            raise UnknownModelError(f"the adapter {name!r} cannot be found", model=name)
        self._registered.pop(name, None)
        self._seen.pop(name, None)
        holders = [w.address for w in snapshot if name in self.held_by(w)]
        results = await asyncio.gather(*(self._connect(a).unload_adapter(name) for a in holders),
                                       return_exceptions=True)
        left = []
        for address, result in zip(holders, results):
            if isinstance(result, BaseException):
                logger.warning("adapter %s: unload on %s failed: %s", name, address, result)
                continue
            self._note(address, [a.name for a in result[0]])
            left.append(address)
        return left


class AdapterHook(AttemptHooks):
    """Adapter placement around a stream's attempts (router/attempt_hooks.py): before each pick of
    a LoRA request some worker holds its adapter (`place`); a worker that refused it as overloaded
    evicted or is unloading it there (`forget`). The pick prefers the holders (router/pick.py)."""

    def __init__(self, placement: AdapterPlacement) -> None:
        self.placement = placement

    async def prepare(self, stream: HookedStream) -> HookedStream | None:
        return stream if stream.request.adapter else None

    async def picking(self, stream: HookedStream) -> None:
        await self.placement.place(stream.request.adapter, stream.features.model or "", stream.features.pool)

    def attempt_ended(self, stream: HookedStream, attempt: Attempt, error: BaseException | None) -> None:
        if isinstance(error, WorkerOverloadedError):
            self.placement.forget(attempt.address, stream.request.adapter)


def choose_workers(workers: Sequence[WorkerView], held_by: Callable[[WorkerView], frozenset[str]]) -> list[WorkerView]:
    """Workers to load a new adapter on, best first: those with a free slot, then the full ones
    (which evict their least recently used adapter); least loaded first within each group."""
    lora = [w for w in workers if w.load is not None and w.load.max_adapters > 0]

    def key(w: WorkerView) -> tuple[bool, int, str]:
        full = len(held_by(w)) >= w.load.max_adapters
        return full, w.in_flight + w.queued, w.address

    return sorted(lora, key=key)
