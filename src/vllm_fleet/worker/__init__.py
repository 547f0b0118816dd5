"""The worker: one engine (vLLM or the mock) behind the `vllm_fleet.v1.Worker` gRPC service."""

from vllm_fleet.worker.engine import Engine, build_engine
from vllm_fleet.worker.server import WorkerServer, run_worker

__all__ = ["Engine", "WorkerServer", "build_engine", "run_worker"]
