"""Async gRPC client for one worker, and a pool that keeps one channel per address."""

from vllm_fleet.client.pool import ClientPool
from vllm_fleet.client.worker_client import ClientOptions, WorkerClient

__all__ = ["ClientOptions", "ClientPool", "WorkerClient"]
