"""`vllm-fleet gateway --processes N`: N full gateway processes on one port, and a parent that keeps them.

One Python process serves on one core; the gateway scales across cores as N processes. Each
child is a whole gateway (its own router, breakers, outstanding counts, class queues) listening
on the same host:port with SO_REUSEPORT, so the kernel spreads new
connections over the children (by a hash of the connection's addresses: a keep-alive connection
stays with one child). No request crosses processes. Two things are shared, through a private
directory the parent makes (0700): per-key limits, as buckets in a file every child maps
(router/quota/shared_buckets.py: a flock'd update of a few microseconds per admission), and, only
when someone scrapes /metrics or the dashboard, each child's figures over Unix sockets
(siblings.py).

The parent binds the address first (without listening) with SO_REUSEPORT: that refuses an
address in use before any child starts, turns port 0 into the port the children share, and
keeps the port while a child restarts. The parent serves nothing itself: it forwards SIGTERM,
SIGINT (both: drain and stop) and SIGHUP (reload keys and limits) to the children, starts again
a child that dies after it listened, and stops everything when one dies before it listened
(a bad flag or file fails in every child alike).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path

from vllm_fleet.errors import ConfigError
from vllm_fleet.gateway.siblings import SiblingSlot
from vllm_fleet.gateway.sockets import bind_socket

logger = logging.getLogger(__name__)

def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind host:port with SO_REUSEPORT, not listening; (the socket, its port). ConfigError if taken."""
    sock = bind_socket(host, port, reuse_port=True)
    sock.setblocking(True)
    return sock, sock.getsockname()[1]


# child(slot, port, listening): serve until a signal; call listening() once the port is served.
Child = Callable[[SiblingSlot, int, Callable[[], None]], int]


class Supervisor:
    """Runs `child` in N forked processes until SIGTERM/SIGINT; the exit code is 0 after a
    drain, else that of a child that failed at start."""

    def __init__(self, child: Child, processes: int, host: str, port: int) -> None:
        if processes < 1:
            raise ConfigError(f"--processes must be at least 1, not {processes}")
        self.child = child
        self.processes = processes
        self._reserved, self.port = reserve_port(host, port)
        # Where the children answer each other's scrapes: mkdtemp makes it 0700, this user's only.
        self.sibling_dir = Path(tempfile.mkdtemp(prefix="vllm-fleet-gateway-"))
        # fork: the children inherit the parsed configuration; nothing (no loop, no thread) runs yet.
        self._context = multiprocessing.get_context("fork")
        # index → (process, set once it listens: an exit before that is a failed start)
        self._children: dict[int, tuple[multiprocessing.process.BaseProcess, object]] = {}
        self._stopping = False
        self._pending: list[int] = []

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            for index in range(self.processes):
                self._start(index)
            logger.info("gateway: %d processes on port %d (pids %s)", self.processes, self.port,
                        ", ".join(str(p.pid) for p, _ in self._children.values()))
            return self._supervise()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._reserved.close()
            shutil.rmtree(self.sibling_dir, ignore_errors=True)

    def _start(self, index: int) -> None:
        listening = self._context.Event()
        slot = SiblingSlot(self.sibling_dir, index, self.processes)
        process = self._context.Process(target=_child_main, args=(self.child, slot, self.port, listening),
                                        name=f"gateway-{index}", daemon=False)
        process.start()
        self._children[index] = (process, listening)

    def _on_signal(self, signum: int, frame) -> None:
        # Only note it here: the loop below forwards it (a handler should do little).
        self._pending.append(signum)

    def _forward(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stopping = True
            signum = signal.SIGTERM  # the children drain on either
        for process, _ in self._children.values():
            if process.is_alive():
                os.kill(process.pid, signum)

    def _supervise(self) -> int:
        code = 0
        while self._children:
            wait([p.sentinel for p, _ in self._children.values()], timeout=0.2)
            while self._pending:
                self._forward(self._pending.pop(0))
            for index, (process, listening) in list(self._children.items()):
                if process.is_alive():
                    continue
                process.join()
                del self._children[index]
                if self._stopping:
                    continue
                if not listening.is_set():
                    logger.error("gateway process %d exited with %s at start; stopping the others", index,
                                 process.exitcode)
                    code = process.exitcode or 1
                    self._forward(signal.SIGTERM)
                    continue
                logger.warning("gateway process %d (pid %s) exited with %s; starting it again", index, process.pid,
                               process.exitcode)
                self._start(index)
        return code


def _child_main(child: Child, slot: SiblingSlot, port: int, listening) -> None:
    # The parent's handlers note signals for its loop; a child handles its own in its event loop.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    code = _exit_code(child, slot, port, listening.set)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not multiprocessing's exit path: it would run the parent's atexit handlers


def _exit_code(child: Child, slot: SiblingSlot, port: int, listening: Callable[[], None]) -> int:
    index = slot.index
    try:
        return int(child(slot, port, listening) or 0)
    except ConfigError as exc:
        print(f"vllm-fleet gateway (process {index}): error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BaseException:
        logger.exception("gateway process %d failed", index)
        return 1
