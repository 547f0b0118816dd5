"""Run the gateway: registry → router → ASGI app → uvicorn (httptools with a head-size bound,
uvloop), optional TLS; keys and limits reload on SIGHUP or a file change (reload.py).

`GatewayServer` owns the lifecycle so the CLI, tests and benchmarks start it the same way:

    server = GatewayServer(config, router_config, registry)
    await server.start()          # router ready (bounded wait), socket bound, serving
    ... server.url ...
    server.reload()               # re-read keys and limits now (SIGHUP); also polled, see reload.py
    await server.stop()           # stop accepting, let streams finish (bounded), close the router
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from vllm_fleet.client import ClientOptions, ClientPool
from vllm_fleet.errors import ConfigError
from vllm_fleet.gateway.app import GatewayApp
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.header_limit import header_limit_protocol
from vllm_fleet.gateway.keys import KeyStore
from vllm_fleet.gateway.reload import LimitsSource, Reloader
from vllm_fleet.gateway.siblings import Siblings, SiblingSlot
from vllm_fleet.gateway.sockets import bind_socket
from vllm_fleet.registry import Registry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.quota.fleet import fleet_quota_from_config
from vllm_fleet.router.quota.shared_buckets import SharedBucketFile

KEY_BUCKETS_FILE = "key-buckets"

logger = logging.getLogger(__name__)


def worker_client_options(config: GatewayConfig) -> ClientOptions:
    """gRPC channel settings toward workers: plaintext, TLS (--worker-tls-ca) or mTLS (+ cert/key)."""
    if config.worker_tls_ca is None:
        return ClientOptions(multiplex=config.worker_multiplex)

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None

    return ClientOptions(tls_ca=read(config.worker_tls_ca), tls_cert=read(config.worker_tls_cert),
                         tls_key=read(config.worker_tls_key), multiplex=config.worker_multiplex)


class GatewayServer:
    """`limits` is where per-key limits come from besides the keys file (default: fixed, those of
    `router_config`); give the CLI's to have a `--key-limits @FILE` reloaded too. `sibling_slot`:
    this is one process of `--processes N`, and /metrics and the dashboard answer for all N."""

    def __init__(self, config: GatewayConfig, router_config: RouterConfig, registry: Registry, *,
                 ready_timeout_s: float = 30.0, shutdown_grace_s: float = 30.0,
                 limits: LimitsSource | None = None, reuse_port: bool = False,
                 sibling_slot: SiblingSlot | None = None) -> None:
        self.config = config
        self.reuse_port = reuse_port
        self.registry = registry
        self.reloader = Reloader(config.api_key_file, limits or LimitsSource.fixed(router_config.admission),
                                 interval_s=config.reload_interval_s)
        loaded = self.reloader.load()  # a bad keys or limits file stops the start (ConfigError)
        self.keys = KeyStore(config.api_key_file, loaded.records) if config.api_key_file else None
        metrics_registry = CollectorRegistry(auto_describe=True)
        # The router owns (starts and closes) the registry.
        self.clients = ClientPool(worker_client_options(config))
        # --fleet-quota: key limits shared with the other gateways through ZooKeeper leases.
        self.quota = fleet_quota_from_config(loaded.admission, metrics_registry)
        # One of `--processes N` without --fleet-quota: the N processes share their key buckets.
        self.shared_key_buckets = (SharedBucketFile(sibling_slot.directory / KEY_BUCKETS_FILE)
                                   if sibling_slot is not None and self.quota is None else None)
        self.router = Router(registry, router_config.model_copy(update={"admission": loaded.admission}), self.clients,
                             metrics_registry=metrics_registry, quota=self.quota,
                             shared_key_buckets=self.shared_key_buckets)
        self.reloader.bind(self.router, self.keys)
        self.siblings = Siblings(sibling_slot) if sibling_slot is not None else None
        self.app = GatewayApp(self.router, config, metrics_registry=metrics_registry, keys=self.keys,
                              registry=registry, siblings=self.siblings)
        self.ready_timeout_s = ready_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.config.tls_cert else "http"
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        if self.quota is not None:
            await self.quota.start()  # ZooKeeper unreachable at start: ConfigError, as for the registry
        await self.router.start()
        try:
            await self.router.wait_ready(timeout=self.ready_timeout_s)
        except Exception as exc:  # serve anyway: /ready says 503 until workers come
            logger.warning("no worker ready after %.0fs (%s); serving, /ready is 503 until one is",
                           self.ready_timeout_s, exc)
        if self.siblings is not None:
            await self.siblings.start({"metrics": self._own_metrics, "state": self.app.dashboard.own_state_bytes})
        sock = bind_socket(self.config.host, self.config.port, reuse_port=self.reuse_port)
        self.port = sock.getsockname()[1]
        uv_config = uvicorn.Config(
            self.app, http=header_limit_protocol(self.config.max_header_bytes), loop="none", lifespan="off",
            access_log=False, log_level="warning",
            ssl_certfile=self.config.tls_cert, ssl_keyfile=self.config.tls_key,
            timeout_graceful_shutdown=self.shutdown_grace_s, backlog=4096, server_header=False,
            timeout_keep_alive=self.config.http_keep_alive_s,
        )
        self._server = _QuietServer(uv_config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise ConfigError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        self.reloader.start()
        await self.app.batches.start()  # resumes the batches a previous run left
        logger.info("gateway listening on %s (models: %s; keys: %s)", self.url,
                    ", ".join(self.router.models()) or "none yet",
                    "%d" % len(self.keys) if self.keys is not None else "off, loopback only")

    async def wait(self) -> None:
        """Until the server stops (a signal, or stop())."""
        if self._task is not None:
            await asyncio.shield(self._task)

    def reload(self) -> bool:
        """Re-read the keys file and the limits now (what SIGHUP does); False, with the reason
        logged, when a file is bad and the previous keys and limits stay in force."""
        return self.reloader.reload()

    async def _own_metrics(self) -> bytes:
        return self.app.metrics.render()

    async def stop(self) -> None:
        await self.reloader.stop()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        await self.app.batches.stop()  # lines in flight are aborted and stay pending for the next run
        if self.siblings is not None:
            await self.siblings.close()
        if self.shared_key_buckets is not None:
            self.shared_key_buckets.close()
        await self.router.close()
        if self.quota is not None:
            await self.quota.close()  # unspent leases go back to the fleet
        await self.clients.close()


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its own signal handling: uvicorn would re-raise SIGTERM after its
    shutdown, killing the process before the router closes. Our caller handles signals."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked = asyncio.Event()
        self._should_exit = False
        super().__init__(config)

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        pass

    # uvicorn's main loop wakes ten times a second to see whether it should exit (and refreshes
    # the Date header every tenth time): on an idle gateway that was most of its wake-ups. Here
    # it wakes once a second for the header, and at once when told to exit.
    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._exit_asked.set()

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # counter 0: a tick that refreshes the Date header
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._exit_asked.wait()
