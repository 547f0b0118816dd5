"""Systems the bench can measure, chosen by `--target`."""

from __future__ import annotations

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.targets.base import Clock, Target, TargetError
from vllm_fleet.errors import ConfigError

__all__ = ["Clock", "Target", "TargetError", "make_target"]


def make_target(config: BenchConfig) -> Target:
    """`http(s)://...` → OpenAI HTTP; `grpc://h:p[,h:p]` → workers; `fleet` → router over --workers."""
    spec = config.target.strip()
    if spec.startswith(("http://", "https://")):
        from vllm_fleet.bench.targets.http import HttpTarget

        return HttpTarget(spec, config)
    if spec.startswith("grpc://"):
        from vllm_fleet.bench.targets.worker import GrpcTarget

        addresses = [a.strip() for a in spec.removeprefix("grpc://").split(",") if a.strip()]
        return GrpcTarget(addresses, config)
    if spec == "fleet":
        from vllm_fleet.bench.targets.worker import FleetTarget

        return FleetTarget(config.workers, config)
    raise ConfigError(f"--target {spec!r}: write http://host:port, grpc://host:port[,host:port] or fleet")
