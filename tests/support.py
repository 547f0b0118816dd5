"""Test support: worker processes (the shipped helper), waiting on conditions with deadlines.

Workers run as real subprocesses (`python -m vllm_fleet.cli worker ...`) so tests see what a
user sees: real ports, real signals, real crashes. They are started with the same helper the
benchmarks, the demo and the node supervisor use: `vllm_fleet.fleet.worker_process`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from vllm_fleet.fleet import worker_process
from vllm_fleet.fleet.worker_process import small_vllm_args
from vllm_fleet.processes import free_port
from worker_forks import ForkServer

__all__ = ["FORKS", "WorkerProcess", "free_port", "vllm_worker_args", "wait_until", "worker_env"]

# The session's fork server for mock workers (conftest starts it early and closes it at the end).
FORKS = ForkServer(tempfile.mkdtemp(prefix="vllm-fleet-forks-"))


def _engine(argv: list[str]) -> str | None:
    for i, word in enumerate(argv):
        if word == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--engine="):
            return word.split("=", 1)[1]
    return None


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
    """The shipped helper; `stop(timeout=...)` is the keyword the tests were written with.

    A mock worker is forked from the session's pre-imported fork server (worker_forks.py) instead
    of starting a Python that imports vLLM again; everything else (a real engine, another
    checkout's code, an environment that changes imports) starts as the helper starts it.
    """

    def start(self) -> "WorkerProcess":
        argv = self.command[3:]  # [python, "-m", "vllm_fleet.cli", "worker", ...]
        env = {**os.environ, **(self.env or {})}
        forkable = (self.command[:3] == [sys.executable, "-m", "vllm_fleet.cli"] and not self.die_with_parent
                    and _engine(argv) == "mock" and FORKS.can_fork(env))
        if not forkable:
            return super().start()
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.process = FORKS.spawn(argv, env, str(self.log_path))
        return self

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
