"""The registry interface: who the workers are, and a way to hear when that changes."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerRecord:
    """One worker as the registry knows it. Only `address` is required; the rest is advisory
    (the router asks the worker itself for its model via Info when a field is empty)."""

    address: str                      # host:port of the gRPC server
    model: str = ""
    device: str = ""                  # e.g. "GPU 0", "MIG 1g.18gb on GPU 0", "cpu 0-1"
    mig_profile: str = ""
    worker_id: str = ""
    pool: str = ""                    # optional worker pool (workload class) name
    capacity: dict[str, float] = field(default_factory=dict)  # e.g. max_num_seqs, kv_tokens

    def to_dict(self) -> dict:
        return {
            "address": self.address, "model": self.model, "device": self.device,
            "mig_profile": self.mig_profile, "worker_id": self.worker_id, "pool": self.pool,
            "capacity": dict(self.capacity),
        }

    @classmethod
    def from_dict(cls, data: dict) -> WorkerRecord:
        known = {k: data[k] for k in ("address", "model", "device", "mig_profile", "worker_id", "pool") if k in data}
        return cls(**known, capacity=dict(data.get("capacity") or {}))


Listener = Callable[[dict[str, WorkerRecord]], None]


class Registry(abc.ABC):
    """Membership. `members()` is the current view keyed by address; listeners get every change.

    A backend that loses its source (ZooKeeper down) keeps the last known view and reports
    `connected == False` until it is back.
    """

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._members: dict[str, WorkerRecord] = {}

    async def start(self) -> None:
        """Connect and load the first view."""

    async def close(self) -> None:
        """Disconnect (a worker registered through this registry is deregistered)."""

    @property
    def connected(self) -> bool:
        return True

    def members(self) -> dict[str, WorkerRecord]:
        return dict(self._members)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(members)` now and on every change; returns an unsubscribe function."""
        self._listeners.append(listener)
        listener(self.members())
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def register(self, record: WorkerRecord) -> None:
        """Announce a worker (node supervisors call this). Static registries refuse."""
        raise NotImplementedError(f"{type(self).__name__} does not accept registrations")

    async def deregister(self, address: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not accept registrations")

    def _set_members(self, members: dict[str, WorkerRecord]) -> None:
        if members == self._members:
            return
        self._members = dict(members)
        for listener in list(self._listeners):
            try:
                listener(self.members())
            except Exception:  # a broken listener must not stop the others
                logger.exception("registry listener failed")
