"""Pool state: registry membership, each worker's Info, health and Load, and local counts.

One task per worker follows its Loads from one source, `WorkerClient.loads()`, which decides
which of the worker's routes brings each (pushed or attached to the GenerateMany call, else the
Load call and health check; the rule is written once, in client/loads.py), so that an idle
gateway makes no unary calls to its workers. Each Load carries the worker's health status; the
pool takes both, and asks for Info whenever the worker becomes SERVING, since a restarted worker
may serve another model. A stream that sees a worker fail calls `report(...)`, which feeds the
breaker and outlier ejection and has the worker's health service asked at once, so a dead worker
leaves rotation in one round trip rather than one poll interval.

A health check that gets no answer (UNREACHABLE: refused, or no reply within its timeout) is
asked again at once before the worker leaves rotation, unless a request to that worker failed
since its last answer. A CPU-starved worker answers late now and then; taking it out for one
late answer moved traffic for nothing, and moved conversations off the worker holding their
prefix cache (session affinity hashes over the serving workers). A dead worker still leaves
at the second miss, or at the first after a failed request.

Progress (what keeps a waiting stream on its worker, see watchdog.py) is the worker's own
account: it is SERVING (or draining) and its engine has not been silent while holding requests
(WorkerLoad.engine_silent_s: no output to any request and no CPU used by the engine's processes).
A request queued behind others on a stepping engine is waiting, not stuck, however long; an engine
that wedges stops stepping whatever it still holds (a wedged engine reports `running > 0` forever),
and a stopped worker process stops answering its health checks. When no fresh Load says (its push
stream broke), the health answer alone decides.

The per-worker record (WorkerState, worker.py) and an attempt's claim on a worker (Lease,
lease.py) are the pool's to make and keep. What else follows the workers (cache-aware routing's
event followers, the batch gate) registers as a PoolListener (listener.py): the pool tells it of
joins, leaves, Infos and Loads, and asks it for its fields of each snapshot's WorkerViews.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from vllm_fleet.client import ClientPool
from vllm_fleet.client.loads import late_after
from vllm_fleet.errors import FleetError, NoWorkerError
from vllm_fleet.protocol.types import REQUEST_FORM, WorkerLoad
from vllm_fleet.registry import Registry, WorkerRecord
from vllm_fleet.router.config import RouterConfig
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.pool.breaker import CircuitBreaker
from vllm_fleet.router.pool.ejection import OutlierDetector
from vllm_fleet.router.pool.lease import Lease
from vllm_fleet.router.pool.listener import PoolListener
from vllm_fleet.router.pool.snapshot import HALF_OPEN, OPEN, SERVING, PoolSnapshot, serves
from vllm_fleet.router.pool.worker import WorkerState

logger = logging.getLogger(__name__)

INFO_TIMEOUT_S = 5.0
# Health checks in a row with no answer before a worker that served (or has not answered yet)
# is taken for unreachable, when no request to it failed meanwhile.
HEALTH_MISSES_TO_LEAVE = 2
# A Load answer younger than this shows the worker process is responsive.
LOAD_FRESH_MIN_S = 5.0
# The share of the retry budget left open when every worker of a model queues requests: errors a
# busy worker answers still get some retries, while a saturated pool is not fed much more work.
MIN_RETRY_HEADROOM = 0.2


class Pool:
    def __init__(self, registry: Registry, clients: ClientPool, config: RouterConfig, metrics: RouterMetrics,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.clients = clients
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._workers: dict[str, WorkerState] = {}
        self._outliers = OutlierDetector(
            failure_ratio=config.ejection_failure_ratio, min_requests=config.ejection_min_requests,
            window_s=config.ejection_window_s, base_ejection_s=config.ejection_base_s,
            max_ratio=config.ejection_max_ratio, clock=clock,
        )
        self._changed = asyncio.Event()
        self._listeners: list[PoolListener] = []  # told of joins, leaves, Infos, Loads (listener.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def listen(self, listener: PoolListener) -> None:
        """Tell `listener` of every worker's join, leave, Info and Load from now on (before start)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._unsubscribe = self.registry.subscribe(self._on_members)

    async def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for address in list(self._workers):
            await self._remove(address)

    # --- membership ---------------------------------------------------------------------

    def _on_members(self, members: dict[str, WorkerRecord]) -> None:
        # ZooKeeper calls listeners from its own thread; the pool lives in the event loop.
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            self._apply(members)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._apply, members)

    def _apply(self, members: dict[str, WorkerRecord]) -> None:
        for address in [a for a in self._workers if a not in members]:
            logger.info("worker %s left the registry", address)
            asyncio.ensure_future(self._remove(address))
        for address, record in members.items():
            worker = self._workers.get(address)
            if worker is not None:
                worker.record = record
                continue
            logger.info("worker %s joined the registry", address)
            self._add(record)
        self._notify()

    def _add(self, record: WorkerRecord) -> None:
        breaker = CircuitBreaker(failure_threshold=self.config.breaker_failures, open_s=self.config.breaker_open_s,
                                 success_threshold=self.config.breaker_successes, clock=self._clock)
        worker = self._workers[record.address] = WorkerState(record, breaker)
        worker.tasks = [asyncio.ensure_future(self._follow(worker))]
        self.metrics.watch_worker(
            record.address, breaker=lambda: breaker.state, in_flight=lambda: worker.in_flight,
            outstanding=lambda: worker.outstanding_tokens,
            serving=lambda: worker.state(self._outliers.is_ejected(record.address)) == SERVING,
        )
        for listener in self._listeners:
            listener.joined(worker)

    async def _remove(self, address: str) -> None:
        worker = self._workers.pop(address, None)
        if worker is None:
            return
        for task in worker.tasks:
            task.cancel()
        for task in worker.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._outliers.forget(address)
        for listener in self._listeners:
            listener.left(address)
        self.metrics.forget_worker(address)
        self._notify()

    # --- following each worker -----------------------------------------------------------

    async def _follow(self, worker: WorkerState) -> None:
        """Take the worker's Loads and health from its one source, WorkerClient.loads()."""
        client = self.clients.get(worker.address)
        interval = self.config.load_poll_interval_s
        while True:
            loads = client.loads(interval, health_every_s=self.config.health_poll_interval_s, check=worker.wake)
            try:
                async with contextlib.aclosing(loads):
                    async for load in loads:
                        await self._take(worker, load)
            except Exception:  # a follower that dies would freeze the worker's state: log and go on
                logger.exception("worker %s: following its Loads failed; following anew", worker.address)
            await asyncio.sleep(interval)

    async def _take(self, worker: WorkerState, load: WorkerLoad) -> None:
        if self._first_miss(worker, load.health):
            worker.wake.set()  # the source asks the worker's health service again at once
            return
        worker.load = load
        worker.load_at = self._clock()
        worker.loads += 1
        for listener in self._listeners:
            listener.loaded(worker)
        await self._apply_health(worker, load.health)

    def _first_miss(self, worker: WorkerState, status: str) -> bool:
        """Whether an unanswered health check is one to ask again before believing it (see above)."""
        if status != "UNREACHABLE" or worker.health not in ("SERVING", "UNKNOWN") or worker.request_failed:
            return False
        worker.missed += 1
        if worker.missed >= HEALTH_MISSES_TO_LEAVE:
            return False
        logger.info("worker %s: no health answer (%d in a row); asking again", worker.address, worker.missed)
        return True

    async def _apply_health(self, worker: WorkerState, status: str) -> None:
        worker.missed = 0
        worker.request_failed = False
        if status == "SERVING" and (worker.health != "SERVING" or worker.info is None):
            await self._fetch_info(worker)
        if status != worker.health:
            logger.info("worker %s health %s -> %s", worker.address, worker.health, status)
            worker.health = status
            self._notify()

    async def _fetch_info(self, worker: WorkerState) -> None:
        try:
            info = await self.clients.get(worker.address).info(timeout=INFO_TIMEOUT_S)
        except FleetError as exc:
            logger.warning("worker %s: Info failed (%s); will retry", worker.address, exc)
            return
        if info.request_form < REQUEST_FORM:
            # A worker of an older release would run this router's requests with the wrong n and
            # default sampling: it stays out of routing until it is upgraded (workers go first).
            if not worker.old_form_logged:
                logger.error("worker %s reads request form %d, this router sends form %d: not routing to it; "
                             "upgrade the worker (vllm-fleet workers are upgraded before routers)",
                             worker.address, info.request_form, REQUEST_FORM)
                worker.old_form_logged = True
            return
        if worker.info is None or worker.info.model != info.model:
            logger.info("worker %s serves %s (max_model_len %d, engine %s)", worker.address, info.model,
                        info.max_model_len, info.engine)
        worker.info = info
        for listener in self._listeners:
            task = listener.info(worker)
            if task is not None:
                worker.tasks.append(asyncio.ensure_future(task))
        self._notify()

    # --- what streams use ---------------------------------------------------------------

    def progressing(self, address: str, limit_s: float) -> bool:
        """Whether a stream that has waited `limit_s` on this worker should keep waiting: the worker
        is up by its health and its engine was not silent for `limit_s` (see the module doc)."""
        worker = self._workers.get(address)
        if worker is None:
            return False
        load = worker.load
        draining = load is not None and load.draining
        if worker.health != "SERVING" and not draining:
            return False  # its own verdict (e.g. its engine stalled), or no answer at all
        window = max(LOAD_FRESH_MIN_S, late_after(self.config.load_poll_interval_s))
        if load is None or self._clock() - worker.load_at > window:
            return True
        return load.engine_silent_s < limit_s

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def serving(self, model: str | None, pool: str | None) -> int:
        """How many workers of `model` (any if None) in `pool` are up and not draining, ejected or
        not: an upper bound on `snapshot().eligible(model, pool)`, counted without making views
        (the cache hook asks it per request)."""
        return sum(1 for w in self._workers.values() if w.state(False) == SERVING and serves(w, model, pool))

    def snapshot(self) -> PoolSnapshot:
        is_ejected = self._outliers.is_ejected
        listeners = self._listeners
        return PoolSnapshot(tuple(w.view(is_ejected(a), _fields(listeners, a)) for a, w in self._workers.items()),
                            self._clock())

    def worker(self, address: str) -> WorkerState | None:
        return self._workers.get(address)

    def try_acquire(self, address: str, tokens: int, *, panic: bool = False) -> Lease | None:
        """Claim `address` for one attempt, or None if it left or its breaker refuses. `panic`:
        every worker of the model is out of rotation (pick.py), so the breaker is not asked."""
        worker = self._workers.get(address)
        if worker is None:
            return None
        if panic:
            return Lease(worker, tokens)
        probing = worker.breaker.state == HALF_OPEN
        if not worker.breaker.allow():
            return None
        return Lease(worker, tokens, probe=probing)

    def report(self, address: str, ok: bool | None, credited: bool = False) -> None:
        """An attempt's verdict on its worker: True ok, False failed, None no verdict (cancelled).
        `credited`: the attempt was a breaker probe whose first output already counted."""
        worker = self._workers.get(address)
        if worker is None:
            return
        if ok is None:
            if not credited:  # a credited probe gave its slot back already; another may hold it
                worker.breaker.release()
            return
        group = self._group(worker)
        if ok:
            if not credited:
                worker.breaker.record_success()
        else:
            worker.breaker.record_failure(may_open=self._may_take_out(address, group))
            worker.request_failed = True
            worker.wake.set()
        if self._outliers.record(address, ok, group, out=self._out_but_ejected):
            logger.warning("worker %s ejected: it failed too many recent requests", address)

    def _group(self, worker: WorkerState) -> list[str]:
        """The addresses of the workers serving `worker`'s model (itself included)."""
        model = worker.info.model if worker.info else ""
        return [a for a, w in self._workers.items() if (w.info.model if w.info else "") == model]

    def _out_but_ejected(self, address: str) -> bool:
        """Out of rotation for another reason than ejection: down by its health, or breaker open."""
        worker = self._workers.get(address)
        return worker is not None and (worker.health != "SERVING" or worker.breaker.state == OPEN)

    def _may_take_out(self, address: str, group: list[str]) -> bool:
        """Whether taking `address` out of rotation keeps the workers out (down by their health,
        open breaker or ejected) within `ejection_max_ratio` of its model's: a model's last
        serving worker is never taken out."""
        out = sum(1 for a in group if a != address and (self._out_but_ejected(a) or self._outliers.is_ejected(a)))
        return out + 1 <= self.config.ejection_max_ratio * len(group)

    def retry_headroom(self, address: str) -> float:
        """The share of the retry budget open now (budget.py): the share of the serving workers of
        `address`'s model that queue nothing (their Load shows no waiting request), at least
        MIN_RETRY_HEADROOM. A retry on a saturated pool only adds work to queues."""
        worker = self._workers.get(address)
        if worker is None:
            return 1.0
        up = [self._workers[a] for a in self._group(worker) if self._workers[a].health == "SERVING"]
        if not up:
            return 1.0
        free = sum(1 for w in up if w.load is None or w.load.waiting == 0)
        return max(MIN_RETRY_HEADROOM, free / len(up))

    def retry_after(self) -> float:
        """A fair Retry-After when no worker can serve: the soonest breaker probe, else one poll."""
        waits = [w.breaker.retry_after() for w in self._workers.values() if w.breaker.retry_after() > 0]
        return round(max(0.5, min(waits, default=self.config.health_poll_interval_s)), 1)

    async def changed(self, timeout: float) -> None:
        """Until the pool changes (membership, health, Info) or `timeout` seconds pass."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel that lands as the event fires.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def wait_ready(self, timeout: float) -> None:
        """Until some worker is serving; NoWorkerError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            if self.snapshot().models():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                states = ", ".join(f"{w.address} {w.state} ({w.health})" for w in self.snapshot()) or "none registered"
                raise NoWorkerError(f"no worker became SERVING within {timeout:.0f}s; workers: {states}",
                                    retry_after=self.retry_after())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()


def _fields(listeners: list[PoolListener], address: str) -> dict[str, object]:
    """The WorkerView fields the listeners own for `address`."""
    fields: dict[str, object] = {}
    for listener in listeners:
        fields.update(listener.view_fields(address))
    return fields
