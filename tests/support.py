"""Test support: worker processes (the shipped helper), waiting on conditions with deadlines.

Workers run as real subprocesses (`python -m vllm_fleet.cli worker ...`) so tests see what a
user sees: real ports, real signals, real crashes. They are started with the same helper the
benchmarks, the demo and the node supervisor use: `vllm_fleet.fleet.worker_process`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

from vllm_fleet.fleet import worker_process
from vllm_fleet.fleet.worker_process import small_vllm_args
from vllm_fleet.processes import free_port

__all__ = ["WorkerProcess", "free_port", "vllm_worker_args", "wait_until", "worker_env"]


async def wait_until(predicate: Callable[[], Awaitable[bool] | bool], *, timeout: float, interval: float = 0.05,
                     message: str = "condition") -> None:
    """Poll `predicate` until true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")
        await asyncio.sleep(interval)


class WorkerProcess(worker_process.WorkerProcess):
    """The shipped helper; `stop(timeout=...)` is the keyword the tests were written with."""

    def stop(self, timeout: float = 60.0) -> int | None:  # type: ignore[override]
        return super().stop(grace_s=timeout)


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_FLEET_LOG_LEVEL", "INFO")
    env.update(extra)
    return env


def vllm_worker_args(cores: str, *extra: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment for a small real vLLM worker on the default model, bound to `cores`.

    float32, not the worker's own choice: tests assert what the 135M model answers (greedy
    "Paris"), and its greedy text changes with the bf16 kernels a CPU has. On this project's
    AMX machine it answered "L'Étoile, la Marseillaise, ..." in bf16 and "The capital of France is
    Paris." in float32 (2026-12-01). The dtype choice itself is tested in tests/worker/test_dtype_choice.py.
    """
    return [*small_vllm_args(), "--dtype", "float32", "--cpu-cores", cores, *extra], worker_env()
