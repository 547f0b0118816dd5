"""Helper processes on this machine: a free port for one, stopping it and everything it
started, and a SIGTERM that lets their owner clean up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it; another process could take it
    before ours binds, which is fine for local workers and benchmarks)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def stop_process_group(process: subprocess.Popen, *, grace_s: float = 60.0) -> None:
    """SIGTERM (a worker drains), wait up to `grace_s`, then SIGKILL the whole process group.

    The sweep matters: vLLM's engine core is a child process that outlives a killed parent.
    The process must have been started with `start_new_session=True`.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(timeout=10)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit, so `finally` blocks that stop worker subprocesses run.

    Python's default SIGTERM action ends the process at once; a benchmark stopped by `timeout`
    or `kill` would leave its workers (started in sessions of their own) running. Under
    `asyncio.run`, the exception ends the loop and the main task is cancelled, which runs its
    `finally` too.
    """
    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
