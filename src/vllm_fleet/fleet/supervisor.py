"""The node supervisor: start the planned workers, register them, keep them alive, drain them.

Each worker is a `WorkerProcess` (`python -m vllm_fleet.cli worker ...` in its own process
group, so stopping it also stops the vLLM engine-core process it spawned). The kernel kills it
if the supervisor dies (PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no orphan
serving stale weights on a GPU.

A crashed worker is deregistered at once and restarted after a backoff that doubles with
each restart in the window; one that crashes `max_restarts` times within `restart_window_s`
is flapping and given up (deregistered, logged) rather than restarted forever. A worker that
is alive but not SERVING (its health says so, or does not answer) is deregistered after a few
checks and, once that has lasted `not_serving_grace_s`, stopped (SIGTERM, then SIGKILL of its
group) and restarted the same way: a hung process or engine never recovers by itself, while a
worker that flips back within the grace keeps running. After any exit, whatever is left of the
worker's process group (an engine-core process) is killed before the next start.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import socket
import tempfile
import time
from pathlib import Path

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import ProcessStartError, WorkerError
from vllm_fleet.fleet.config import SupervisorConfig
from vllm_fleet.fleet.plan import Plan, WorkerSpec
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.registry.base import Registry, WorkerRecord
from vllm_fleet.worker.server import EXIT_ENGINE_DIED, EXIT_ENGINE_STALLED

logger = logging.getLogger(__name__)

UNHEALTHY_CHECKS = 3     # consecutive failed health checks before a live worker is deregistered
# A worker stopped for not serving has nothing worth draining: SIGKILL its group after this.
UNHEALTHY_STOP_GRACE_S = 5.0
_EXIT_REASONS = {EXIT_ENGINE_DIED: "its engine died", EXIT_ENGINE_STALLED: "its engine stalled"}


class ManagedWorker:
    """One planned worker: its process, its registration, its restart history."""

    def __init__(self, spec: WorkerSpec, registry: Registry | None, config: SupervisorConfig, log_dir: Path) -> None:
        self.spec = spec
        self.registry = registry
        self.config = config
        self.log_path = log_dir / f"worker-{spec.worker_id}.log"
        self.state = "new"            # starting, serving, unhealthy, backoff, failed, stopped
        self.restarts: collections.deque[float] = collections.deque()
        self.process = WorkerProcess(command=spec.argv(), env=spec.env, host=spec.host, port=spec.port,
                                     log_path=self.log_path, die_with_parent=True)
        self.serving = asyncio.Event()
        # Set once the first start has ended, serving or not; the next worker sharing this GPU waits for it.
        self.first_start_settled = asyncio.Event()
        self.start_after: ManagedWorker | None = None
        self.spawned_at: float | None = None       # monotonic time of the last start, and of SERVING
        self.serving_since: float | None = None
        self._stopping = False
        self._registered = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def run(self) -> None:
        """Start, watch and restart until stopped or given up."""
        if self.start_after is not None:
            logger.info("worker %s waits for %s, which shares its GPU, to finish starting", self.spec.worker_id,
                        self.start_after.spec.worker_id)
            await self.start_after.first_start_settled.wait()
        while not self._stopping:
            self._spawn()
            await self._serve_until_exit()
            self.first_start_settled.set()
            self.process.kill()  # the exited worker's engine core may outlive it
            await self._deregister()
            if self._stopping:
                break
            code = self.process.returncode
            if not self._may_restart():
                self.state = "failed"
                logger.error("worker %s (%s) exited with %s and restarted %d times in %.0fs: flapping, given up; "
                             "the end of its log (%s):\n%s", self.spec.worker_id, self.spec.device, code,
                             len(self.restarts), self.config.restart_window_s, self.log_path,
                             self.process.log_tail(20))
                return
            delay = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (len(self.restarts) - 1))
            self.state = "backoff"
            logger.warning("worker %s (%s) exited with %s (%s); restart %d in %.1fs (log %s)", self.spec.worker_id,
                           self.spec.device, code, _EXIT_REASONS.get(code, "unexpected"), len(self.restarts),
                           delay, self.log_path)
            await asyncio.sleep(delay)
        self.state = "stopped"

    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > self.config.restart_window_s:
            self.restarts.popleft()
        if len(self.restarts) >= self.config.max_restarts:
            return False
        self.restarts.append(now)
        return True

    def _spawn(self) -> None:
        self.state = "starting"
        self.serving.clear()
        self.spawned_at = time.monotonic()
        self.process.start()
        logger.info("worker %s (%s) started: pid %s, %s", self.spec.worker_id, self.spec.device, self.process.pid,
                    self.spec.address)

    async def _serve_until_exit(self) -> None:
        """Wait for SERVING (or exit), register, then health-check until the process exits."""
        try:
            await self.process.wait_serving(self.config.startup_timeout_s)
        except ProcessStartError as exc:
            if exc.returncode is None:  # alive but not serving in time: a hung start
                logger.error("worker %s not SERVING after %.0fs; killing it (log %s)", self.spec.worker_id,
                             self.config.startup_timeout_s, self.log_path)
                self.process.kill()
            return
        async with WorkerClient(self.spec.address) as client:
            await self._register(client)
            self.state = "serving"
            self.serving_since = time.monotonic()
            self.serving.set()
            self.first_start_settled.set()
            logger.info("worker %s (%s) SERVING at %s", self.spec.worker_id, self.spec.device, self.spec.address)
            await self._watch_health(client, asyncio.ensure_future(self.process.wait_exit()))

    async def _watch_health(self, client: WorkerClient, exited: asyncio.Future) -> None:
        failures = 0
        not_serving_since: float | None = None
        while not exited.done():
            done, _ = await asyncio.wait({exited}, timeout=self.config.health_interval_s)
            if done or self._stopping:
                break
            status = await client.health(timeout=min(2.0, self.config.health_interval_s))
            healthy = status == "SERVING"
            failures = 0 if healthy else failures + 1
            not_serving_since = None if healthy else not_serving_since or time.monotonic()
            if not healthy and time.monotonic() - not_serving_since >= self.config.not_serving_grace_s:
                await self._stop_not_serving(status, time.monotonic() - not_serving_since)
                break
            if failures == UNHEALTHY_CHECKS:
                logger.warning("worker %s not SERVING for %d checks: deregistered until it recovers, restarted if "
                               "it does not within %.0fs", self.spec.worker_id, failures,
                               self.config.not_serving_grace_s)
                self.state = "unhealthy"
                await self._deregister()
            elif healthy and (not self._registered or self.state == "unhealthy"):
                await self._register(client)
                self.state = "serving"
        await exited

    async def _stop_not_serving(self, status: str, for_s: float) -> None:
        self.state = "unhealthy"
        logger.error("worker %s (pid %s) alive but %s for %.0fs (grace %.0fs): stopping it for a restart "
                     "(log %s)", self.spec.worker_id, self.pid, status, for_s, self.config.not_serving_grace_s,
                     self.log_path)
        await self._deregister()
        await self.process.astop(UNHEALTHY_STOP_GRACE_S)

    async def _register(self, client: WorkerClient) -> None:
        if self.registry is None or self._stopping:
            return
        try:
            model = (await client.info()).model
        except WorkerError:
            model = self.spec.engine.served_model_name or self.spec.engine.model or ""
        # The pool is in the record too, so routers see it before they have fetched the worker's Info.
        record = WorkerRecord(
            address=_advertised(self.spec), model=model, device=self.spec.device, mig_profile=self.spec.mig_profile,
            worker_id=self.spec.worker_id, capacity=self.spec.capacity_summary(), pool=self.spec.pool,
        )
        try:
            await self.registry.register(record)
        except Exception as exc:  # registry down: serve anyway; the health loop retries
            logger.warning("worker %s: could not register (%s); retrying", self.spec.worker_id, exc)
            return
        self._registered = True
        if self._stopping:
            # stop() ran while this registration was in flight (a health check that answered
            # SERVING as the drain began): its deregistration found nothing to remove, so undo
            # ours, or the drained worker would stay registered until the node's session ends.
            await self._deregister()

    async def _deregister(self) -> None:
        if self.registry is None or not self._registered:
            return
        self._registered = False
        try:
            await self.registry.deregister(_advertised(self.spec))
        except Exception:  # the registry may be down; the ephemeral node dies with our session
            logger.warning("worker %s: could not deregister", self.spec.worker_id, exc_info=True)

    async def stop(self, grace_s: float) -> None:
        """Drain: deregister, SIGTERM the worker, SIGKILL whatever is left of its group after `grace_s`."""
        self._stopping = True
        await self._deregister()
        await self.process.astop(grace_s)


def _advertised(spec: WorkerSpec) -> str:
    # A worker bound to every interface is reached through this host's name.
    host = socket.getfqdn() if spec.host in ("0.0.0.0", "::") else spec.host
    return f"{host}:{spec.port}"


def _start_gpu_sharers_in_turn(workers: list[ManagedWorker]) -> None:
    """Workers that share one GPU (shares like gpu:0@0.45) start one after another.

    vLLM sizes its KV cache at start from the memory its own profiling run sees used; an engine
    starting beside another one counts the other's allocations as its own and may find no
    room for the cache at all. Whole GPUs and MIG instances have a CUDA_VISIBLE_DEVICES of their
    own and start at once. Restarts are not ordered: the engines already running hold steady."""
    last_on: dict[str, ManagedWorker] = {}
    for worker in workers:
        device = worker.spec.env.get("CUDA_VISIBLE_DEVICES", "")
        if not device:
            continue
        worker.start_after = last_on.get(device)
        last_on[device] = worker


class NodeSupervisor:
    """Runs a plan's workers: `await start()`, then `await stop()` (or `run_until_signal()`)."""

    def __init__(self, plan: Plan, registry: Registry | None, config: SupervisorConfig | None = None) -> None:
        self.plan = plan
        self.registry = registry
        self.config = config or SupervisorConfig()
        self.log_dir = Path(self.config.log_dir or tempfile.mkdtemp(prefix="vllm-fleet-node-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.workers = [ManagedWorker(spec, registry, self.config, self.log_dir) for spec in plan.workers]
        _start_gpu_sharers_in_turn(self.workers)
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        logger.info("node: starting %d workers (logs in %s)", len(self.workers), self.log_dir)
        self._tasks = [asyncio.create_task(w.run(), name=f"worker-{w.spec.worker_id}") for w in self.workers]

    async def wait_serving(self, timeout: float) -> None:
        """Until every worker is SERVING (raises TimeoutError)."""
        await asyncio.wait_for(asyncio.gather(*(w.serving.wait() for w in self.workers)), timeout)

    async def stop(self) -> None:
        logger.info("node: draining %d workers (grace %.0fs)", len(self.workers), self.config.stop_grace_s)
        await asyncio.gather(*(w.stop(self.config.stop_grace_s) for w in self.workers))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        logger.info("node: all workers stopped")

    async def run_until_signal(self) -> None:
        """Start, then drain on SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        await self.stop()
