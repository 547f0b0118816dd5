"""The worker process: gRPC server + health + metrics + signals around one engine.

Lifecycle: bind the port (health NOT_SERVING) → load the engine → SERVING. A monitor flips
health to NOT_SERVING within `health_interval_s` when the engine dies, and the process exits
shortly after (code 3) so a supervisor restarts it. An engine that is alive but stalled (it
holds requests and has produced nothing past the bound engine_watch.py derives) takes the same
path: NOT_SERVING, every request it held fails with UNAVAILABLE (routers move those streams),
its processes are killed (they may never answer a shutdown), exit code 4.
SIGTERM drains: NOT_SERVING, new Generate calls are refused with UNAVAILABLE, in-flight streams
get up to `drain_grace_s` to finish, then stop.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_async, health_pb2, health_pb2_grpc

from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import ConfigError, WorkerUnavailableError
from vllm_fleet.heap import settle_garbage_collector
from vllm_fleet.protocol import SERVICE_NAME, worker_pb2_grpc
from vllm_fleet.worker.engines.base import Engine, build_engine
from vllm_fleet.worker.watch.engine_cpu import EngineCpu
from vllm_fleet.worker.watch.decision_log import log_watch_decision
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.service import WorkerService

logger = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_ENGINE_DEATH_EXIT_S = 5.0  # keep answering NOT_SERVING this long before exiting
_STALLED_SHUTDOWN_S = 10.0  # a stalled engine's shutdown, after its processes were killed
EXIT_ENGINE_DIED = 3
EXIT_ENGINE_STALLED = 4


class WorkerServer:
    def __init__(self, config: WorkerConfig, engine: Engine, metrics: WorkerMetrics | None = None) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics or WorkerMetrics()
        self.service = WorkerService(engine, config, self.metrics)
        self.health = health_async.HealthServicer()
        self.port: int | None = None
        self._stop = asyncio.Event()
        self._engine_died = False
        self._engine_stalled = False
        self._engine_cpu = EngineCpu()
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve (NOT_SERVING), then load the engine and switch to SERVING."""
        size = self.config.max_message_mb * 1024 * 1024
        self._server = grpc.aio.server(options=[
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            # Clients ping every ~10 s to detect dead connections; allow it even when idle.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
            # Our own pings find clients that vanished without closing (their streams get cancelled).
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ])
        worker_pb2_grpc.add_WorkerServicer_to_server(self.service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        await self._set_health(NOT_SERVING)
        self.port = self._bind(f"{self.config.host}:{self.config.port}")
        await self._server.start()
        logger.info("worker listening on %s (engine %s loading)", self.address, self.engine.name)
        await self.engine.start()
        await self.service.router_ids.start(self.engine)  # the digest of the tokenizer files it serves
        await self.service.load_static_adapters(getattr(getattr(self.engine, "config", None), "lora", []))  # --lora
        settle_garbage_collector()
        await self._set_health(SERVING)
        logger.info("worker %s SERVING model %s", self.address, self.engine.info().model)

    def _bind(self, target: str) -> int:
        if self.config.tls_cert:
            if not self.config.tls_key:
                raise ConfigError("--tls-cert needs --tls-key")
            client_ca = Path(self.config.tls_client_ca).read_bytes() if self.config.tls_client_ca else None
            credentials = grpc.ssl_server_credentials(
                [(Path(self.config.tls_key).read_bytes(), Path(self.config.tls_cert).read_bytes())],
                root_certificates=client_ca, require_client_auth=client_ca is not None,
            )
            port = self._server.add_secure_port(target, credentials)
        else:
            port = self._server.add_insecure_port(target)
        if port == 0:
            raise ConfigError(f"cannot bind {target}: is the port in use?")
        return port

    async def _set_health(self, status: int) -> None:
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)
        self.service.health = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        self.metrics.serving.set(1 if status == SERVING else 0)

    async def monitor(self) -> None:
        """Follow engine health and load; exit soon after the engine dies."""
        serving = True
        while not self._stop.is_set():
            healthy = self.engine.healthy
            if serving and (not healthy or self.service.draining):
                serving = False
                await self._set_health(NOT_SERVING)
            if not healthy and not self._engine_died:
                self._engine_died = True
                logger.error("the engine died; NOT_SERVING, exiting in %.0fs", _ENGINE_DEATH_EXIT_S)
                asyncio.get_running_loop().call_later(_ENGINE_DEATH_EXIT_S, self._stop.set)
            busy = self._engine_cpu.advanced()
            if healthy and not self._engine_stalled:
                stall = self.service.watch.check(self.config.health_interval_s, engine_busy=busy)
                log_watch_decision(self.service.watch.last, self._engine_cpu.last)
                if stall:
                    serving = False
                    await self._on_stall()
            if healthy:
                load = self.engine.load()
                self.metrics.running.set(load.running)
                self.metrics.waiting.set(load.waiting)
                self.metrics.kv_usage.set(load.kv_cache_usage)
                self.metrics.prefix_hit_rate.set(load.prefix_cache_hit_rate)
            try:
                await asyncio.wait_for(self._stop.wait(), self.config.health_interval_s)
            except TimeoutError:
                pass

    async def _on_stall(self) -> None:
        """The engine holds requests but stopped producing: NOT_SERVING, fail them, exit soon."""
        stall = self.service.watch.stall
        self._engine_stalled = True
        await self._set_health(NOT_SERVING)
        failed = self.service.fail_all(WorkerUnavailableError(
            f"the engine produced no output for {stall.silent_s:.1f}s with requests running; "
            "the worker is restarting: send the request to another worker"))
        logger.error("engine stalled: %d engine request(s) running, no output for %.1fs (bound %.1fs; longest "
                     "recent step %.3fs); NOT_SERVING, failed request(s) %s; exiting in %.0fs",
                     len(stall.engine_ids), stall.silent_s, stall.bound_s, stall.step_s, ", ".join(failed),
                     _ENGINE_DEATH_EXIT_S)
        asyncio.get_running_loop().call_later(_ENGINE_DEATH_EXIT_S, self._stop.set)

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def drain_and_stop(self) -> None:
        """NOT_SERVING, refuse new work, let in-flight streams finish (up to the grace), stop."""
        self.service.draining = True
        await self._set_health(NOT_SERVING)
        if self._engine_stalled:
            await self._stop_stalled()
            return
        if self.service.active:
            logger.info("draining %d in-flight request(s), up to %.0fs", len(self.service.active),
                        self.config.drain_grace_s)
            try:
                await asyncio.wait_for(self.service.idle.wait(), self.config.drain_grace_s)
            except TimeoutError:
                logger.warning("grace period over; cancelling %d request(s)", len(self.service.active))
        if self.engine.kv_relay is not None:
            self.engine.kv_relay.close()  # KvEvents streams end now, not at the server's grace
        if self._server is not None:
            await self._server.stop(grace=1.0)
        await self.engine.shutdown()
        logger.info("worker %s stopped", self.address)

    async def _stop_stalled(self) -> None:
        """Stop around a wedged engine: nothing in it will finish, and a stopped EngineCore never
        answers a shutdown, so its processes are killed first (their memory goes back before the
        supervisor starts the next worker), then the server and what is left of the engine."""
        for child in multiprocessing.active_children():
            logger.warning("killing engine process %s (pid %s)", child.name, child.pid)
            child.kill()
        if self._server is not None:
            await self._server.stop(grace=1.0)
        try:
            await asyncio.wait_for(self.engine.shutdown(), _STALLED_SHUTDOWN_S)
        except Exception:  # the engine is gone either way; the exit code tells the supervisor why
            logger.warning("shutdown of the stalled engine failed", exc_info=True)
        logger.info("worker %s stopped (engine stalled)", self.address)

    @property
    def engine_died(self) -> bool:
        return self._engine_died

    @property
    def exit_code(self) -> int:
        """0 after a drain; EXIT_ENGINE_DIED or EXIT_ENGINE_STALLED when the engine failed."""
        if self._engine_stalled:  # first: killing a stalled engine may make it look dead too
            return EXIT_ENGINE_STALLED
        return EXIT_ENGINE_DIED if self._engine_died else 0


async def run_worker(worker_config: WorkerConfig, engine_config: EngineConfig,
                     on_ready: Callable[[WorkerServer], None] | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT (drain) or engine death. Returns the exit code."""
    if worker_config.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(worker_config.metrics_port, addr=worker_config.host)
    server = WorkerServer(worker_config, build_engine(engine_config))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    await server.start()
    if on_ready is not None:
        on_ready(server)
    monitor = asyncio.create_task(server.monitor())
    await server.wait_stopped()
    monitor.cancel()
    await server.drain_and_stop()
    return server.exit_code
