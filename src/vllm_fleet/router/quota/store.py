"""Where fleet-wide key quotas live: one znode per key in the ZooKeeper we already run.

    /vllm-fleet/<cluster>/quota/keys/<sha256 of the key, 32 hex>   {"requests": .., "tokens": .., "at": ..}
    /vllm-fleet/<cluster>/quota/gateways/gw-<seq>                  ephemeral, one per running gateway

A change is a compare-and-set: read the node with its version, compute the new state
(quota_bucket.py), `set` it with that version; a concurrent change makes the set fail with
BadVersion and the change is computed again. Gateways count each other through their ephemeral
nodes (a ChildrenWatch), which is what the fallback share divides by.

kazoo runs on its own threads: blocking calls go through the loop's executor with a deadline
(`op_timeout_s`), and connection changes hop to the loop with `call_soon_threadsafe`. A change
whose deadline passes may still be applied once the connection returns; the compare-and-set
keeps it consistent, and at worst one lease is lost (the key admits a little less, never more).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable

from vllm_fleet.errors import ConfigError, FleetError
from vllm_fleet.registry.zookeeper import call_on_loop, parse_zk_url

logger = logging.getLogger(__name__)

ROOT = "/vllm-fleet"
MAX_CAS_ATTEMPTS = 20   # a hot key contended by many gateways converges long before this


class QuotaStoreUnavailable(FleetError):
    """The coordinator did not answer in time. Recoverable: the quota falls back to local shares."""

    recoverable = resend_safe = True


class ZooKeeperQuotaStore:
    """Per-key shared state changed by compare-and-set, and the count of live gateways."""

    def __init__(self, url: str, *, session_timeout_s: float = 10.0, op_timeout_s: float = 2.0,
                 connect_timeout_s: float = 15.0) -> None:
        self.hosts, self.cluster = parse_zk_url(url, option="--fleet-quota")
        self.base = f"{ROOT}/{self.cluster}/quota"
        self.session_timeout_s = session_timeout_s
        self.op_timeout_s = op_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._client = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_connected: Callable[[bool], None] = lambda connected: None
        self._on_gateways: Callable[[int], None] = lambda count: None
        self._member: str | None = None
        self._session_lost = False

    async def start(self, on_connected: Callable[[bool], None], on_gateways: Callable[[int], None]) -> None:
        """Connect, join the gateways, watch their count. ConfigError if ZooKeeper is unreachable."""
        try:
            from kazoo.client import KazooClient  # optional dependency: vllm-fleet[registry]
            from kazoo.recipe.watchers import ChildrenWatch
        except ImportError:
            raise ConfigError("--fleet-quota needs kazoo: pip install 'vllm-fleet[registry]'") from None

        self._loop = asyncio.get_running_loop()
        self._on_connected, self._on_gateways = on_connected, on_gateways
        # Reconnect attempts at most 1 s apart (kazoo's default backs off to 60 s), so the
        # fallback ends soon after ZooKeeper returns.
        self._client = KazooClient(hosts=self.hosts, timeout=self.session_timeout_s,
                                   connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0})
        self._client.add_listener(self._on_state)
        try:
            await self._loop.run_in_executor(None, lambda: self._client.start(timeout=self.connect_timeout_s))
        except Exception as exc:
            self._client.close()
            self._client = None
            raise ConfigError(f"--fleet-quota: cannot reach ZooKeeper at {self.hosts} within "
                              f"{self.connect_timeout_s:.0f}s: {exc}") from exc
        await self._loop.run_in_executor(None, self._join)
        ChildrenWatch(self._client, f"{self.base}/gateways", self._on_children)
        logger.info("fleet quota: shared through zk://%s%s", self.hosts, self.base)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.remove_listener(self._on_state)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, client.stop)
        client.close()

    async def update(self, key: str, change: Callable[[dict | None], tuple[dict | None, object]]):
        """Apply `change(state) → (new state or None to leave it, result)` to `key`'s node under
        compare-and-set; the result. QuotaStoreUnavailable when ZooKeeper does not answer in time."""
        if self._client is None or self._loop is None:
            raise QuotaStoreUnavailable("the fleet quota store is not started")
        return await self._loop.run_in_executor(None, self._update, self._node(key), change)

    async def ping(self) -> None:
        """Return once ZooKeeper answers a read; QuotaStoreUnavailable if it does not in time."""
        if self._client is None or self._loop is None:
            raise QuotaStoreUnavailable("the fleet quota store is not started")
        await self._loop.run_in_executor(None, self._ping)

    # -- kazoo's threads -----------------------------------------------------------------

    def _update(self, path: str, change):
        from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

        client, timeout = self._client, self.op_timeout_s
        if client is None:
            raise QuotaStoreUnavailable("the fleet quota store is closed")
        try:
            for _ in range(MAX_CAS_ATTEMPTS):
                try:
                    data, stat = client.get_async(path).get(timeout=timeout)
                    state, version = json.loads(data.decode()) if data else None, stat.version
                except NoNodeError:
                    state, version = None, None
                new, result = change(state)
                if new is None:
                    return result
                payload = json.dumps(new).encode()
                try:
                    if version is None:
                        client.create_async(path, payload, makepath=True).get(timeout=timeout)
                    else:
                        client.set_async(path, payload, version=version).get(timeout=timeout)
                    return result
                except (BadVersionError, NodeExistsError, NoNodeError):
                    continue  # another gateway changed it first: compute again from its state
            raise QuotaStoreUnavailable(f"{MAX_CAS_ATTEMPTS} concurrent changes in a row on {path}")
        except (KazooException, client.handler.timeout_exception) as exc:
            raise QuotaStoreUnavailable(f"ZooKeeper did not answer: {type(exc).__name__}") from exc

    def _ping(self) -> None:
        from kazoo.exceptions import KazooException

        client = self._client
        if client is None:
            raise QuotaStoreUnavailable("the fleet quota store is closed")
        try:
            client.exists_async(self.base).get(timeout=self.op_timeout_s)
        except (KazooException, client.handler.timeout_exception) as exc:
            raise QuotaStoreUnavailable(f"ZooKeeper did not answer: {type(exc).__name__}") from exc

    def _join(self) -> None:
        self._member = self._client.create(f"{self.base}/gateways/gw-", ephemeral=True, sequence=True,
                                           makepath=True)

    def _on_children(self, children: list[str]) -> bool | None:
        if self._client is None:
            return False
        self._call_on_loop(self._on_gateways, max(1, len(children)))
        return None

    def _on_state(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.CONNECTED:
            if self._session_lost:  # a new session: our ephemeral node died with the old one
                self._client.handler.spawn(self._rejoin)
            self._session_lost = False
            self._call_on_loop(self._on_connected, True)
        else:
            self._session_lost = self._session_lost or state == KazooState.LOST
            self._call_on_loop(self._on_connected, False)

    def _rejoin(self) -> None:
        try:
            self._join()
        except Exception:
            logger.exception("fleet quota: could not rejoin the gateways after a new ZooKeeper session")

    def _call_on_loop(self, callback, *args) -> None:
        call_on_loop(self._loop, callback, *args)

    def _node(self, key: str) -> str:
        # Keys may be secrets (Router.stream's `key`) and may hold '/': store a digest.
        return f"{self.base}/keys/{hashlib.sha256(key.encode()).hexdigest()[:32]}"
