"""Helper processes on this machine: a free port for one, a child process with its own log
that is stopped together with everything it started, and a SIGTERM that lets its owner clean up.

    async with GatewayProcess(["--workers", worker.address]) as gateway:
        await gateway.wait_ready(timeout=60)     # raises ProcessStartError with its log tail
        ... gateway.url ...
    # SIGTERM (drain), then SIGKILL for whatever is left of its process group

`ServiceProcess` is the general shape. Tests, benchmarks, the demo and the node supervisor
start two kinds: `vllm_fleet.fleet.worker_process.WorkerProcess` (ready when its gRPC health
says SERVING) and `GatewayProcess` (ready when GET /ready answers 200).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

from vllm_fleet.errors import ProcessStartError

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
READY_POLL_S = 0.1     # between readiness probes while a process starts
EXIT_POLL_S = 0.05     # between exit checks where pidfd_open is missing (not Linux >= 5.3)
REAP_TIMEOUT_S = 10.0  # after SIGKILL, the kernel frees a process in milliseconds


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
            logger.warning("pid %s did not exit %.0fs after SIGTERM: killing its process group", process.pid, grace_s)
    _kill_group(process)
    if process.poll() is None:
        process.wait(timeout=REAP_TIMEOUT_S)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the process leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


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


# Set for a child started with die_with_parent=True: the pid whose death must end it. Only our
# own CLI reads it, so die_with_parent applies to `python -m vllm_fleet.cli ...` children.
PARENT_PID_ENV = "VLLM_FLEET_PARENT_PID"


def die_with_parent(parent_pid: int) -> None:
    """Arrange for this process to get SIGKILL when `parent_pid` (its parent) dies, even by SIGKILL
    (Linux; elsewhere the owner's process-group kill on stop still applies).

    A child calls this itself, early in its own main (the CLI does when PARENT_PID_ENV is set),
    not through Popen's preexec_fn: preexec_fn runs Python in a forked copy of a parent whose
    gRPC threads hold locks, and a supervisor's restart crashed there with SIGSEGV.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class ServiceProcess:
    """A child process in a session of its own, its output appended to `log_path`.

    `start()` (again after it exited, for a restart), `await wait_for(probe, timeout)`,
    `signal()`, `kill()`, `stop(grace_s)` (blocking) or `await astop(grace_s)`, `log_tail()`. As a context manager, sync or async, it
    is started on entry and stopped on exit. `env` is added to this process's environment.
    With `die_with_parent`, the kernel kills it if its owner dies, even by SIGKILL.
    """

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None, *,
                 log_path: str | Path | None = None, name: str = "process", die_with_parent: bool = False,
                 stop_grace_s: float = 60.0) -> None:
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.log_path = Path(log_path) if log_path else _new_log(name)
        self.name = name
        self.die_with_parent = die_with_parent
        self.stop_grace_s = stop_grace_s
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        """The exit code once it exited (negative: killed by that signal); None while it runs."""
        return self.process.poll() if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Self:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        env = {**os.environ, **(self.env or {})}
        if self.die_with_parent:  # the child arms it itself (die_with_parent): no preexec_fn
            env[PARENT_PID_ENV] = str(os.getpid())
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        logger.debug("%s started: pid %s, log %s", self.name, self.process.pid, self.log_path)
        return self

    def signal(self, sig: int) -> None:
        """Send `sig` to the process itself (not its group): SIGTERM drains, SIGSTOP hangs it."""
        if self.running:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process and everything it started (vLLM's engine core), and reap it."""
        if self.process is not None:
            _kill_group(self.process)
            if self.process.poll() is None:
                self.process.wait(timeout=REAP_TIMEOUT_S)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM, wait up to `grace_s` (default `stop_grace_s`) to drain, SIGKILL the group.
        Blocks; the exit code (None if it was never started)."""
        if self.process is None:
            return None
        stop_process_group(self.process, grace_s=self.stop_grace_s if grace_s is None else grace_s)
        return self.process.returncode

    async def astop(self, grace_s: float | None = None) -> int | None:
        """`stop()` without blocking the event loop, so that many processes drain at once."""
        if self.process is None:
            return None
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        try:
            if self.running:
                self.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.wait_exit(), grace_s)
                except asyncio.TimeoutError:
                    logger.warning("%s did not exit %.0fs after SIGTERM: killing it", self.name, grace_s)
        finally:  # even when cancelled: nothing of the group may outlive its owner
            _kill_group(self.process)
        return await self.wait_exit()

    async def wait_exit(self) -> int:
        """Until the process exits (it is reaped); its exit code. Does not block the loop."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        if self.process.poll() is None:
            await _exited(self.process)
        return self.process.wait()

    async def wait_for(self, probe: Callable[[], Awaitable[bool]], timeout: float) -> None:
        """Until `probe()` is true (e.g. the service answers). Raises ProcessStartError, carrying
        the end of the log, if the process exits first or `timeout` seconds pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            code = self.returncode
            if code is not None:
                raise self._start_error(f"{self.name} exited with code {code} while starting", code)
            if await probe():
                return
            if loop.time() >= deadline:
                raise self._start_error(f"{self.name} was not ready after {timeout:.0f}s", None)
            await asyncio.sleep(READY_POLL_S)

    def _start_error(self, what: str, code: int | None) -> ProcessStartError:
        tail = self.log_tail()
        return ProcessStartError(f"{what}; the end of its log ({self.log_path}):\n{tail}", returncode=code,
                                 log_tail=tail)

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of its log (what a failure message shows)."""
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()


class GatewayProcess(ServiceProcess):
    """`vllm-fleet gateway ARGS` on host:port (a free port unless given); ready when GET /ready
    answers 200, i.e. when enough of its workers serve."""

    def __init__(self, args: Sequence[str] = (), env: Mapping[str, str] | None = None, *, port: int | None = None,
                 host: str = "127.0.0.1", log_path: str | Path | None = None, python: str = sys.executable,
                 stop_grace_s: float = 30.0) -> None:
        self.args = list(args)
        self.host = host
        self.port = port or free_port(host)
        command = [python, "-m", "vllm_fleet.cli", "gateway", "--host", host, "--port", str(self.port), *self.args]
        super().__init__(command, env, log_path=log_path, name=f"gateway {self.url}", stop_grace_s=stop_grace_s)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def wait_ready(self, timeout: float) -> None:
        """Until GET /ready is 200; ProcessStartError (with the log tail) if it exits or times out."""
        await self.wait_for(lambda: _http_ok(self.host, self.port, "/ready"), timeout)


async def _http_ok(host: str, port: int, path: str, timeout: float = 2.0) -> bool:
    """Whether GET `path` answers 200 (HTTP/1.0, no client library needed)."""
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), timeout)
        return status.split()[1:2] == [b"200"]
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()


async def _exited(process: subprocess.Popen) -> None:
    """Until `process` has exited (not reaped): a pidfd becomes readable then; else poll."""
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is already gone
        while process.poll() is None:
            await asyncio.sleep(EXIT_POLL_S)
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _new_log(name: str) -> Path:
    prefix = "vllm-fleet-" + "".join(c if c.isalnum() else "-" for c in name.split()[0]) + "-"
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return Path(path)
