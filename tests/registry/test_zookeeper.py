"""The ZooKeeper registry against a real ZooKeeper server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from prometheus_client import REGISTRY

from support import wait_until
from vllm_fleet.errors import ConfigError
from vllm_fleet.registry import WorkerRecord, open_registry
from vllm_fleet.registry.zookeeper import ZooKeeperRegistry

SESSION_S = 2.0


def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def registries(zookeeper):
    """`make(cluster)` → a started registry; all are closed after the test."""
    made: list[ZooKeeperRegistry] = []

    async def make(name: str, **options) -> ZooKeeperRegistry:
        registry = ZooKeeperRegistry(zookeeper.hosts, name, session_timeout_s=SESSION_S, **options)
        await registry.start()
        made.append(registry)
        return registry

    yield make
    for registry in made:
        await registry.close()


async def test_registered_worker_reaches_watchers_with_its_record(registries):
    name = cluster()
    watcher = await registries(name)
    seen: list[tuple[set[str], bool]] = []
    loop_thread = threading.current_thread()
    watcher.subscribe(lambda members: seen.append((set(members), threading.current_thread() is loop_thread)))

    node = await registries(name)
    record = WorkerRecord(address="127.0.0.1:50051", model="Qwen/Qwen3.5-9B", device="MIG 1g.18gb #2 on GPU 0",
                          mig_profile="1g.18gb", worker_id="n1-w2", capacity={"max_num_seqs": 32.0, "kv_tokens": 9000.0})
    await node.register(record)
    await wait_until(lambda: "127.0.0.1:50051" in watcher.members(), timeout=10, message="member visible")

    assert watcher.members()["127.0.0.1:50051"] == record
    assert all(on_loop for _, on_loop in seen), "listeners must run on the asyncio loop, not kazoo's thread"
    assert seen[-1][0] == {"127.0.0.1:50051"}

    await node.deregister("127.0.0.1:50051")
    await wait_until(lambda: not watcher.members(), timeout=10, message="member removed")


async def test_clusters_do_not_see_each_other(registries):
    first, second = await registries(cluster()), await registries(cluster())
    await first.register(WorkerRecord(address="127.0.0.1:1"))
    await wait_until(lambda: first.members(), timeout=10, message="own member")
    assert second.members() == {}


async def test_changed_record_is_seen(registries):
    name = cluster()
    watcher, node = await registries(name), await registries(name)
    await node.register(WorkerRecord(address="127.0.0.1:7", model="a"))
    await wait_until(lambda: watcher.members().get("127.0.0.1:7", WorkerRecord("")).model == "a", timeout=10)
    await node.register(WorkerRecord(address="127.0.0.1:7", model="b"))
    await wait_until(lambda: watcher.members()["127.0.0.1:7"].model == "b", timeout=10, message="data update")


HOLDER = """
import asyncio, sys
from vllm_fleet.registry import WorkerRecord
from vllm_fleet.registry.zookeeper import ZooKeeperRegistry

async def main():
    registry = ZooKeeperRegistry(sys.argv[1], sys.argv[2], session_timeout_s=float(sys.argv[3]))
    await registry.start()
    await registry.register(WorkerRecord(address="127.0.0.1:60001", worker_id="doomed"))
    print("registered", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_killed_holder_disappears_when_its_session_expires(registries, zookeeper):
    name = cluster()
    watcher = await registries(name)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, zookeeper.hosts, name, str(SESSION_S)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "registered"
        await wait_until(lambda: "127.0.0.1:60001" in watcher.members(), timeout=10, message="holder registered")
        os.kill(holder.pid, signal.SIGKILL)  # no chance to deregister: only session expiry removes it
        holder.wait(timeout=10)
        # Expiry happens after the session timeout; allow generous slack for a loaded CI machine.
        await wait_until(lambda: "127.0.0.1:60001" not in watcher.members(), timeout=SESSION_S + 10,
                         message="ephemeral node removed by session expiry")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


async def test_outage_keeps_last_membership_and_reports_disconnected(registries, zookeeper):
    name = cluster()
    # A longer session so the node's ephemeral entry survives the outage.
    watcher = await registries(name)
    node = ZooKeeperRegistry(zookeeper.hosts, name, session_timeout_s=30)
    await node.start()
    try:
        await node.register(WorkerRecord(address="127.0.0.1:50060"))
        await wait_until(lambda: "127.0.0.1:50060" in watcher.members(), timeout=10, message="member")
        gauge = lambda: REGISTRY.get_sample_value("vllm_fleet_registry_connected", {"cluster": name})  # noqa: E731
        assert watcher.connected and gauge() == 1

        zookeeper.stop()
        await wait_until(lambda: not watcher.connected, timeout=15, message="disconnected")
        assert set(watcher.members()) == {"127.0.0.1:50060"}
        assert gauge() == 0

        zookeeper.start()
        await wait_until(lambda: watcher.connected, timeout=30, message="reconnected")
        assert gauge() == 1
        assert set(watcher.members()) == {"127.0.0.1:50060"}
    finally:
        if zookeeper.process is None:
            zookeeper.start()
        await node.close()


def test_urls():
    registry = open_registry("zk://10.0.0.1:2181,10.0.0.2:2181/prod")
    assert isinstance(registry, ZooKeeperRegistry)
    assert (registry.hosts, registry.cluster, registry.path) == (
        "10.0.0.1:2181,10.0.0.2:2181", "prod", "/vllm-fleet/prod/workers")
    assert ZooKeeperRegistry.from_url("zk://h:1").cluster == "default"


# The same table as tests/router/test_shared_quota.py: both read zk:// URLs with one parser.
@pytest.mark.parametrize("url, reason", [
    ("http://zk:2181/x", "is not zk://host:port"),
    ("zk://zk/x", "'zk' in 'zk://zk/x' is not host:port"),
    ("zk://zk:2181/a/b", "cluster name 'a/b' in .* must contain no '/'"),
])
def test_a_bad_registry_url_says_what_is_wrong(url, reason):
    with pytest.raises(ConfigError, match=f"^registry URL.*{reason}"):
        ZooKeeperRegistry.from_url(url)


async def test_unreachable_zookeeper_is_a_clear_error():
    from support import free_port

    registry = ZooKeeperRegistry(f"127.0.0.1:{free_port()}", cluster(), connect_timeout_s=1.0)
    with pytest.raises(ConfigError, match="cannot reach ZooKeeper"):
        await registry.start()
