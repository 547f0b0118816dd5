"""A real ZooKeeper server for tests: started on a free port with its own config and data in a
temp dir; `stop()`/`start()` simulate an outage. Used by tests/registry and tests/fleet."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import free_port

JARS = "/usr/share/java"
CLASSPATH_JARS = [
    "zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar", "netty-handler.jar", "netty-common.jar",
    "netty-buffer.jar", "netty-transport.jar", "netty-codec.jar", "netty-resolver.jar",
    "netty-transport-native-epoll.jar", "netty-transport-native-unix-common.jar", "metrics-core.jar",
    "commons-cli.jar", "snappy-java.jar", "commons-io.jar",
]
START_TIMEOUT_S = 60.0


class ZooKeeperServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.config = workdir / "zoo.cfg"
        # tickTime 500 ms lets tests use 1-4 s sessions (ZooKeeper's floor is 2 ticks).
        self.config.write_text(
            f"tickTime=500\nminSessionTimeout=1000\nmaxSessionTimeout=60000\ndataDir={workdir / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok\n"
        )
        self.process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        classpath = ":".join(f"{JARS}/{jar}" for jar in CLASSPATH_JARS)
        log = open(self.workdir / "zookeeper.log", "ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ZooKeeper did not start; log: {(self.workdir / 'zookeeper.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None


def zookeeper_server():
    """Generator for a session fixture: a started server, stopped and removed afterwards."""
    if not shutil.which("java") or not Path(JARS, "zookeeper.jar").exists():
        pytest.fail("ZooKeeper is not installed: apt-get install -y zookeeper (scripts/services.sh does it)")
    workdir = Path(tempfile.mkdtemp(prefix="vllm-fleet-zk-"))
    server = ZooKeeperServer(workdir)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)
