"""Test support: start worker processes, wait on conditions with deadlines.

Workers run as real subprocesses (`python -m vllm_fleet.cli worker ...`) so tests see what a
user sees: real ports, real signals, real crashes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from vllm_fleet.client import WorkerClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


@dataclass
class WorkerProcess:
    """A worker subprocess. `address` is host:port; the log is kept in a temp file."""

    args: list[str]
    env: dict[str, str]
    port: int
    process: subprocess.Popen | None = None
    log_path: str = field(default_factory=lambda: tempfile.mktemp(prefix="vllm-fleet-worker-", suffix=".log"))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vllm_fleet.cli", "worker", "--port", str(self.port), *self.args],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )
        return self

    async def wait_serving(self, timeout: float) -> None:
        client = WorkerClient(self.address)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log_tail()}")
                if await client.health(timeout=1.0) == "SERVING":
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"worker {self.address} not SERVING after {timeout:.0f}s:\n{self.log_tail()}")
        finally:
            await client.close()

    def signal(self, sig: int) -> None:
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """kill -9 the worker and everything it started (vLLM's engine core process)."""
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (drain) and wait; kill if it does not exit in time."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # The engine core may outlive a killed parent: sweep the process group.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return "(no log)"


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_FLEET_LOG_LEVEL", "INFO")
    env.update(extra)
    return env


def vllm_worker_args(cores: str, *extra: str) -> tuple[list[str], dict[str, str]]:
    """Arguments for a real vLLM worker on the default model, bound to `cores`.

    enforce_eager: start in ~30 s instead of ~100 s; a small KV cache and context keep memory
    at ~3 GB per worker so two or three fit beside Spark on the CI machine.
    """
    args = ["--engine", "vllm", "--enforce-eager", "--max-model-len", "2048", "--kv-cache-space-gb", "1",
            "--cpu-cores", cores, *extra]
    return args, worker_env(VLLM_CPU_OMP_THREADS_BIND=cores, VLLM_CPU_KVCACHE_SPACE="1")
