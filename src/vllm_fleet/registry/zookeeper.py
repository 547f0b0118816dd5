"""Membership in ZooKeeper: each worker is an ephemeral node holding its WorkerRecord as JSON.

    /vllm-fleet/<cluster>/workers/<host:port>   {"address": ..., "model": ..., "capacity": {...}}

An ephemeral node lives as long as the ZooKeeper session of whoever created it (the node
supervisor, or a Spark task), so a worker whose supervisor dies disappears by itself within
the session timeout. Readers keep a ChildrenWatch on the folder and a DataWatch per child.

kazoo calls watches on its own thread; every change hops back to the asyncio loop with
`call_soon_threadsafe`, so listeners (the router) run on the loop like everything else.
When ZooKeeper is unreachable the last known membership stays, `connected` is False, a
warning is logged and the gauge `vllm_fleet_registry_connected` drops to 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from urllib.parse import urlsplit

from prometheus_client import Gauge

from vllm_fleet.errors import ConfigError
from vllm_fleet.registry.base import Registry, WorkerRecord

logger = logging.getLogger(__name__)

ROOT = "/vllm-fleet"
REGISTRY_CONNECTED = Gauge(
    "vllm_fleet_registry_connected", "1 while the registry backend is reachable, 0 while serving the last known view",
    ["cluster"],
)


def parse_zk_url(url: str, *, option: str = "registry URL") -> tuple[str, str]:
    """`zk://host:port[,host:port...]/cluster` → (hosts, cluster); cluster defaults to 'default'.

    Every zk:// URL of the fleet is read here (the registry's, --fleet-quota's), so a URL that
    works for one works for the other. ConfigError, naming `option` (where the URL came from), if
    it is malformed."""
    parts = urlsplit(url)
    if parts.scheme != "zk" or not parts.netloc:
        raise ConfigError(f"{option} {url!r} is not zk://host:port[,host:port]/cluster")
    for host in parts.netloc.split(","):
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit():
            raise ConfigError(f"{option}: ZooKeeper address {host!r} in {url!r} is not host:port")
    cluster = parts.path.strip("/") or "default"
    if "/" in cluster:
        raise ConfigError(f"{option}: cluster name {cluster!r} in {url!r} must contain no '/'")
    return parts.netloc, cluster


def call_on_loop(loop: asyncio.AbstractEventLoop | None, callback, *args) -> None:
    """Run `callback(*args)` on `loop` from one of kazoo's threads; nothing once the loop is gone."""
    if loop is None or loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # loop closed between the check and the call
        pass

class ZooKeeperRegistry(Registry):
    """Registry backed by ZooKeeper ephemeral nodes under /vllm-fleet/<cluster>/workers/."""

    def __init__(self, hosts: str, cluster: str = "default", *, session_timeout_s: float = 10.0,
                 connect_timeout_s: float = 15.0) -> None:
        super().__init__()
        if not cluster or "/" in cluster:
            raise ConfigError(f"cluster name {cluster!r} must be non-empty and contain no '/'")
        self.hosts = hosts
        self.cluster = cluster
        self.base = f"{ROOT}/{cluster}"          # other per-cluster nodes (e.g. Spark job flags) go here
        self.path = f"{self.base}/workers"
        self.session_timeout_s = session_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._client = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()             # guards _records (kazoo threads write it)
        self._records: dict[str, WorkerRecord] = {}
        self._watched: set[str] = set()
        self._registered: dict[str, WorkerRecord] = {}
        self._connected = False
        self._session_lost = False
        REGISTRY_CONNECTED.labels(cluster=cluster).set(0)

    @classmethod
    def from_url(cls, url: str, **options: float) -> ZooKeeperRegistry:
        """`zk://host:port[,host:port...]/cluster` (cluster defaults to 'default')."""
        hosts, cluster = parse_zk_url(url)
        return cls(hosts, cluster, **options)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        from kazoo.client import KazooClient  # optional dependency: vllm-fleet[registry]
        from kazoo.recipe.watchers import ChildrenWatch

        self._loop = asyncio.get_running_loop()
        self._client = KazooClient(hosts=self.hosts, timeout=self.session_timeout_s)
        self._client.add_listener(self._on_state)
        try:
            await self._loop.run_in_executor(None, lambda: self._client.start(timeout=self.connect_timeout_s))
        except Exception as exc:
            self._client.close()
            raise ConfigError(f"cannot reach ZooKeeper at {self.hosts} within {self.connect_timeout_s:.0f}s: {exc}") from exc
        self._set_connected(True)
        await self._loop.run_in_executor(None, self._client.ensure_path, self.path)
        ChildrenWatch(self._client, self.path, self._on_children)
        logger.info("registry: watching zk://%s%s", self.hosts, self.path)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        loop = asyncio.get_running_loop()
        for address in list(self._registered):
            try:
                await loop.run_in_executor(None, client.delete, self._node(address))
            except Exception as exc:  # the session may be gone already; its nodes with it
                logger.debug("registry: could not delete %s on close: %s", address, exc)
        self._registered.clear()
        await loop.run_in_executor(None, client.stop)
        client.close()
        self._set_connected(False)

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def kazoo(self):
        """The underlying KazooClient (None until started), for recipes beyond membership."""
        return self._client

    # -- registration ---------------------------------------------------------------------

    async def register(self, record: WorkerRecord) -> None:
        """Create (or replace) this worker's ephemeral node; it is recreated after a session loss."""
        self._require_started()
        self._registered[record.address] = record
        await asyncio.get_running_loop().run_in_executor(None, self._write_node, record)
        logger.info("registry: registered %s (%s)", record.address, record.device or "?")

    async def deregister(self, address: str) -> None:
        from kazoo.exceptions import NoNodeError

        self._require_started()
        self._registered.pop(address, None)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._client.delete, self._node(address))
        except NoNodeError:
            pass
        logger.info("registry: deregistered %s", address)

    def _write_node(self, record: WorkerRecord) -> None:
        from kazoo.exceptions import NodeExistsError

        data = json.dumps(record.to_dict()).encode()
        path = self._node(record.address)
        try:
            self._client.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            # Ours (re-registration) or a previous process's whose session has not expired
            # yet: the address is ours now, so take the node over.
            _, stat = self._client.get(path)
            if stat.ephemeralOwner == self._client.client_id[0]:
                self._client.set(path, data)
            else:
                self._client.delete(path)
                self._client.create(path, data, ephemeral=True, makepath=True)

    def _node(self, address: str) -> str:
        return f"{self.path}/{address}"

    def _require_started(self) -> None:
        if self._client is None:
            raise ConfigError("the ZooKeeper registry is not started: await registry.start() first")

    # -- watches (kazoo's thread) ---------------------------------------------------------

    def _on_children(self, children: list[str]) -> bool | None:
        from kazoo.recipe.watchers import DataWatch

        if self._client is None:
            return False  # closed: stop watching
        current = set(children)
        with self._lock:
            for gone in set(self._records) - current:
                del self._records[gone]
            new = current - self._watched
            self._watched |= new
        for child in new:
            DataWatch(self._client, self._node(child), self._data_watcher(child))
        self._publish()
        return None

    def _data_watcher(self, child: str):
        # The watch outlives deletions (kazoo then watches for the node's return), so a
        # worker that re-registers under the same address needs no new watch.
        def on_data(data: bytes | None, _stat) -> bool | None:
            if self._client is None:
                return False
            with self._lock:
                record = _parse(child, data) if data is not None else None
                if record is None:
                    self._records.pop(child, None)
                else:
                    self._records[child] = record
            self._publish()
            return None
        return on_data

    def _publish(self) -> None:
        with self._lock:
            members = {r.address: r for r in self._records.values()}
        self._call_on_loop(self._set_members, members)

    def _on_state(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.CONNECTED:
            self._call_on_loop(self._set_connected, True)
            if self._session_lost and self._registered:
                # A new session: our ephemeral nodes died with the old one.
                self._client.handler.spawn(self._reregister)
            self._session_lost = False
        else:
            self._session_lost = self._session_lost or state == KazooState.LOST
            self._call_on_loop(self._set_connected, False)

    def _reregister(self) -> None:
        for record in list(self._registered.values()):
            try:
                self._write_node(record)
                logger.info("registry: re-registered %s after a new ZooKeeper session", record.address)
            except Exception:
                logger.exception("registry: could not re-register %s", record.address)

    def _call_on_loop(self, callback, *args) -> None:
        call_on_loop(self._loop, callback, *args)

    def _set_connected(self, connected: bool) -> None:
        if connected == self._connected:
            return
        self._connected = connected
        REGISTRY_CONNECTED.labels(cluster=self.cluster).set(1 if connected else 0)
        if connected:
            logger.info("registry: connected to ZooKeeper %s", self.hosts)
        else:
            logger.warning("registry: ZooKeeper %s unreachable; keeping the last known %d workers",
                           self.hosts, len(self._members))


def _parse(child: str, data: bytes) -> WorkerRecord | None:
    try:
        record = WorkerRecord.from_dict(json.loads(data.decode()))
    except (ValueError, TypeError, KeyError) as exc:
        logger.warning("registry: ignoring worker node %s with bad data: %s", child, exc)
        return None
    return record if record.address else WorkerRecord.from_dict({**record.to_dict(), "address": child})
