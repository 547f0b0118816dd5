"""A fixed list of workers, from the command line or a config file."""

from __future__ import annotations

from vllm_fleet.errors import ConfigError
from vllm_fleet.registry.base import Registry, WorkerRecord


class StaticRegistry(Registry):
    def __init__(self, records: list[WorkerRecord]) -> None:
        super().__init__()
        if not records:
            raise ConfigError("no workers given: pass --workers host:port[,host:port...] or --registry zk://...")
        self._set_members({r.address: r for r in records})

    @classmethod
    def from_spec(cls, spec: str | list[str]) -> StaticRegistry:
        """`host:port,host:port` or a list of addresses."""
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        records = []
        for item in (i.strip() for i in items):
            if not item:
                continue
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"worker address {item!r} is not host:port")
            records.append(WorkerRecord(address=item))
        return cls(records)

    def set_workers(self, records: list[WorkerRecord]) -> None:
        """Replace the list (tests, or a config reload)."""
        self._set_members({r.address: r for r in records})
