"""Rows and tokens done, live, from the executors to whoever runs the job (`spark-run`).

Spark's own progress is per task: a one-partition job shows "0/1 tasks" until it ends, and
accumulators reach the driver only when a task finishes. So each executor task sends its
running totals (rows answered, rows failed, output tokens) to a listener on the driver, at most
every `SEND_EVERY_S` and once more when the task ends: UDP datagrams, one small JSON object
each, never blocking a row. The listener keeps each task's latest totals (keyed by stage and
partition, so a retried task replaces its failed attempt's count rather than adding to it) and
sums them. A lost datagram is repaired by the next one; the figures are for a person to read,
and the job's summary still counts its output.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SEND_EVERY_S = 0.5
_MAX_DATAGRAM = 2048


@dataclass(slots=True)
class Totals:
    rows: int = 0
    errors: int = 0
    tokens: int = 0


class ProgressReporter:
    """One task's running totals, sent to `address` (host:port); a no-op without one."""

    def __init__(self, address: str | None, task_key: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.task_key = task_key
        self.totals = Totals()
        self._clock = clock
        self._sent_at = float("-inf")
        self._target: tuple[str, int] | None = None
        self._socket: socket.socket | None = None
        if address:
            host, _, port = address.rpartition(":")
            self._target = (host, int(port))
            self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._socket.setblocking(False)

    def row_done(self, *, error: bool, tokens: int) -> None:
        self.totals.rows += 1
        self.totals.errors += int(error)
        self.totals.tokens += tokens
        if self._clock() - self._sent_at >= SEND_EVERY_S:
            self.send()

    def send(self) -> None:
        if self._socket is None or self._target is None:
            return
        self._sent_at = self._clock()
        message = json.dumps({"task": self.task_key, "rows": self.totals.rows, "errors": self.totals.errors,
                              "tokens": self.totals.tokens}).encode()
        try:
            self._socket.sendto(message, self._target)
        except OSError as exc:  # a full buffer or a gone driver: progress is advisory, rows go on
            logger.debug("progress datagram to %s not sent: %s", self._target, exc)

    def close(self) -> None:
        self.send()
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class ProgressListener:
    """The driver's side: a UDP socket on `host` (an ephemeral port) and a thread that reads it.
    `address` is what executors send to; `totals()` sums every task's latest report."""

    def __init__(self, host: str = "127.0.0.1", advertise: str | None = None) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((host, 0))
        self._socket.settimeout(0.2)
        self.address = f"{advertise or host}:{self._socket.getsockname()[1]}"
        self._tasks: dict[str, Totals] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="vllm-fleet-progress", daemon=True)
        self._thread.start()

    def totals(self) -> Totals:
        with self._lock:
            tasks = list(self._tasks.values())
        return Totals(sum(t.rows for t in tasks), sum(t.errors for t in tasks), sum(t.tokens for t in tasks))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(_MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                report = json.loads(data)
                totals = Totals(int(report["rows"]), int(report["errors"]), int(report["tokens"]))
                task = str(report["task"])
            except (ValueError, KeyError, TypeError):
                continue  # not ours: the port is open to the network
            with self._lock:
                self._tasks[task] = totals


def progress_line(done: Totals, total_rows: int | None, elapsed_s: float) -> str:
    """`rows 120/1000 (12%)  4.0 rows/s  310 tokens/s  ETA 3m40s  errors 1`, for a terminal."""
    rate = done.rows / elapsed_s if elapsed_s > 0 else 0.0
    tokens = done.tokens / elapsed_s if elapsed_s > 0 else 0.0
    if total_rows:
        share = f"rows {done.rows}/{total_rows} ({100 * done.rows / total_rows:.0f}%)"
        eta = _duration((total_rows - done.rows) / rate) if rate > 0 else "unknown"
        line = f"{share}  {rate:.1f} rows/s  {tokens:.0f} tokens/s  ETA {eta}"
    else:
        line = f"rows {done.rows}  {rate:.1f} rows/s  {tokens:.0f} tokens/s"
    return line + (f"  errors {done.errors}" if done.errors else "")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
