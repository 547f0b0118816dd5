"""Worker membership behind one interface: a static list, or ZooKeeper (`registry/zookeeper.py`)."""

from vllm_fleet.registry.base import Registry, WorkerRecord
from vllm_fleet.registry.static import StaticRegistry

__all__ = ["Registry", "StaticRegistry", "WorkerRecord", "open_registry"]


def open_registry(spec: str) -> Registry:
    """`host:port,host:port` (static) or `zk://host:port[,host:port]/cluster` (ZooKeeper)."""
    if spec.startswith("zk://"):
        from vllm_fleet.registry.zookeeper import ZooKeeperRegistry  # kazoo is optional

        return ZooKeeperRegistry.from_url(spec)
    return StaticRegistry.from_spec(spec)
