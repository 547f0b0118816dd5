"""Mock workers forked from one pre-imported process, for the suite's ~150 mock worker starts.

A mock worker prepares requests with vLLM's own request models, so starting one imports vLLM,
torch and transformers: ~9 s of CPU before it serves, of a start that is otherwise ~0.5 s. This
module keeps one process (the "fork server") that has imported all of that once; each mock
worker is a fork of it, serving in well under a second. What a test sees is unchanged: a process
of its own session (`killpg` reaches it), its output in its log, SIGTERM drains it, SIGKILL kills
it at once, its exit code comes back as a `subprocess.Popen`'s would (negative: the signal).

    python tests/worker_forks.py SOCKET     # the fork server (ForkServer starts it)

Protocol, one Unix-socket connection per worker: the test sends one JSON line
{"argv", "env", "cwd", "log"}; the server forks and answers "<pid>\\n", then, once the worker
has exited and been reaped, "<exit code>\\n".

Only what the import does not depend on may differ between workers: a worker whose environment
changes how Python, gRPC or vLLM import (PYTHONPATH, GRPC_*, ...) starts as a plain subprocess.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

# Read when Python, gRPC or vLLM import (or by the dynamic loader): a worker that needs another
# value than the fork server had cannot be a fork of it.
IMPORT_TIME_PREFIXES = ("PYTHON", "GRPC_", "LD_", "VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING", "VLLM_PLUGINS",
                        "TRANSFORMERS_", "HF_", "TORCH", "OMP_", "MKL_", "CUDA")
_PR_SET_PDEATHSIG = 1
# Set (to anything) to start every mock worker as a plain subprocess, e.g. to tell a failure of
# the fork from one of the test.
DISABLE_ENV = "VLLM_FLEET_TEST_NO_FORKS"
READY_TIMEOUT_S = 180.0


# ---- the fork server ------------------------------------------------------------------------

def _die_with(parent_pid: int) -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _preimport() -> None:
    """What every mock worker would import on its own: the CLI, the worker, vLLM's request models."""
    import vllm_fleet.cli  # noqa: F401
    import vllm_fleet.cli.worker  # noqa: F401
    import vllm_fleet.worker.engines.mock_engine  # noqa: F401
    import vllm_fleet.worker.server  # noqa: F401
    from vllm_fleet.worker.prepare import import_vllm_meaning

    import_vllm_meaning()


def _read_request(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the test closed the connection before its request")
        data += chunk
    return json.loads(data)


def _become_worker(request: dict, server_pid: int) -> int:
    """In the forked child: the worker's own session, output, environment and command line."""
    os.setsid()
    _die_with(server_pid)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["vllm-fleet", *request["argv"]]
    from vllm_fleet.cli import main

    try:
        return main(request["argv"])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(path: str) -> int:
    """The fork server's loop. Returns only in a forked child, with the worker's exit code: the
    child leaves the loop by returning, so it exits as any Python process does (atexit included)."""
    _preimport()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    me = os.getpid()
    print(f"fork server {me} ready on {path}", flush=True)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its test's connection)
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "accept":
                    conn, _ = listener.accept()
                    try:
                        request = _read_request(conn)
                    except (ConnectionError, ValueError):
                        conn.close()
                        continue
                    sys.stdout.flush()
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        listener.close()
                        conn.close()
                        for _, other in children.values():
                            other.close()
                        return _become_worker(request, me)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = (pid, conn)
                    selector.register(pidfd, selectors.EVENT_READ, "exit")
                    _send(conn, f"{pid}\n")
                else:
                    pidfd = key.fd
                    pid, conn = children.pop(pidfd)
                    selector.unregister(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(pid, 0)
                    _send(conn, f"{os.waitstatus_to_exitcode(status)}\n")
                    conn.close()
    finally:
        if os.getpid() == me:
            for pid, _ in children.values():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _send(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(text.encode())
    except OSError:  # the test is gone; the worker is still reaped
        pass


# ---- the test's side ------------------------------------------------------------------------

class ForkedWorker:
    """The part of `subprocess.Popen` that `ServiceProcess` uses, for a worker the fork server
    forked: pid, poll(), wait(timeout), send_signal(), returncode."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        self.returncode: int | None = None
        self.pid = int(self._line(timeout=30.0))

    def _line(self, timeout: float | None) -> str | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:  # the fork server died: its children were killed with it
                self._buffer += f"{-signal.SIGKILL}\n".encode()
                break
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                if timeout == 0:
                    return None  # type: ignore[return-value]  # poll()'s answer: still running
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self.returncode = int(line)
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The fork server, started on first use and stopped with `close()`."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "forks.sock")
        self.log = os.path.join(directory, "fork-server.log")
        self._process: subprocess.Popen | None = None
        self._env: dict[str, str] = {}

    def start(self) -> None:
        """Start it (its imports run in the background); `spawn` waits until it listens."""
        if self._process is not None:
            return
        self._env = dict(os.environ)
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, self.path, str(os.getpid())], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def can_fork(self, env: Mapping[str, str]) -> bool:
        """Whether a worker with this environment may be a fork (see IMPORT_TIME_PREFIXES)."""
        if os.environ.get(DISABLE_ENV):
            return False
        self._env = self._env or dict(os.environ)
        keys = {key for key in {*env, *self._env} if key.startswith(IMPORT_TIME_PREFIXES)}
        return all(env.get(key) == self._env.get(key) for key in keys)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: str) -> ForkedWorker:
        self.start()
        conn = self._connect()
        conn.sendall(json.dumps({"argv": list(argv), "env": dict(env), "cwd": os.getcwd(),
                                 "log": str(log_path)}).encode() + b"\n")
        return ForkedWorker(conn)

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                with open(self.log, errors="replace") as log:
                    tail = log.read()[-3000:]
                raise RuntimeError(f"the fork server exited with {self._process.returncode}; its log:\n{tail}")
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.path)
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not listen within {READY_TIMEOUT_S:.0f}s ({self.log})")
            time.sleep(0.05)  # polling a socket that appears once the server's imports are done

    def close(self) -> None:
        """Stop it (and any worker it forked that is still running); its folder goes too."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


if __name__ == "__main__":
    _die_with(int(sys.argv[2]))
    sys.exit(serve(sys.argv[1]))
