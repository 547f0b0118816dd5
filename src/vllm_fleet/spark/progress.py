"""Rows and tokens done, live, from the executors to whoever runs the job (`spark-run`).

Spark's own progress is per task: a one-partition job shows "0/1 tasks" until it ends, and
accumulators reach the driver only when a task finishes. So each executor task sends its
running totals (rows answered, rows failed, output tokens) to a listener on the driver, at most
every `SEND_EVERY_S` and once more when the task ends: UDP datagrams, one small JSON object
each, never blocking a row. The listener keeps each task's latest totals (keyed by stage and
partition, so a retried task replaces its failed attempt's count rather than adding to it) and
sums them. A lost datagram is repaired by the next one; the figures are for a person to read,
and the job's summary still counts its output.

Rows that wait for batch capacity (no worker has slack: router/classes/batch_wait.py) finish no rows,
so a task also reports from a heartbeat on its router's event loop, every `SEND_EVERY_S`, with
its router's account of the batch requests waiting and why. The driver shows "waiting for batch
capacity: <reason>" once requests have waited `SHOW_WAIT_AFTER_S` (a moment's wait for a freed
slot is routine), from reports younger than `WAIT_FRESH_S` (a task that ended or died stops
counting). The rows keep waiting: the wait never fails a row, nor counts against its
request_timeout_s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.router.classes.batch_wait import BatchWaitStatus

logger = logging.getLogger(__name__)

SEND_EVERY_S = 0.5
SHOW_WAIT_AFTER_S = 5.0
WAIT_FRESH_S = 5.0
_MAX_DATAGRAM = 2048
_MAX_REASON_CHARS = 1500  # the rest of a datagram holds the counts; a longer reason is cut


@dataclass(slots=True)
class Totals:
    rows: int = 0
    errors: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Waiting:
    """Requests of the job waiting for batch capacity: how many, the longest wait, and why."""

    requests: int
    waited_s: float
    reason: str


class ProgressReporter:
    """One task's running totals, sent to `address` (host:port); a no-op without one.
    `waiting`: its router's `batch_wait_status`, read by `heartbeat()` on the router's loop."""

    def __init__(self, address: str | None, task_key: str, clock: Callable[[], float] = time.monotonic,
                 waiting: Callable[[], BatchWaitStatus] | None = None) -> None:
        self.task_key = task_key
        self.totals = Totals()
        self._clock = clock
        self._waiting_of = waiting
        # The heartbeat runs on the router's loop, close() on Spark's thread: the last status read
        # and the socket change under this lock, so nothing stale follows the final report.
        self._lock = threading.Lock()
        self._waiting = BatchWaitStatus()
        self._closing = False
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

    async def heartbeat(self) -> None:
        """Report every SEND_EVERY_S until cancelled, with the router's waiting batch: rows that
        wait finish nothing, so row_done() alone would go quiet just when there is news."""
        while True:
            await asyncio.sleep(SEND_EVERY_S)
            status = self._waiting_of() if self._waiting_of is not None else BatchWaitStatus()
            with self._lock:
                if self._closing:
                    return
                self._waiting = status
            self.send()

    def send(self) -> None:
        with self._lock:
            if self._socket is None or self._target is None:
                return
            self._sent_at = self._clock()
            waiting = self._waiting
            message = json.dumps({"task": self.task_key, "rows": self.totals.rows, "errors": self.totals.errors,
                                  "tokens": self.totals.tokens, "waiting": waiting.waiting,
                                  "waited_s": round(waiting.waited_s, 1),
                                  "reason": waiting.reason[:_MAX_REASON_CHARS]}).encode()
            try:
                self._socket.sendto(message, self._target)
            except OSError as exc:  # a full buffer or a gone driver: progress is advisory, rows go on
                logger.debug("progress datagram to %s not sent: %s", self._target, exc)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._waiting = BatchWaitStatus()  # the task is over: none of its rows waits
        self.send()
        with self._lock:
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
        self._waits: dict[str, tuple[Waiting, float]] = {}  # task -> what waits there, when it said so
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="vllm-fleet-progress", daemon=True)
        self._thread.start()

    def totals(self) -> Totals:
        with self._lock:
            tasks = list(self._tasks.values())
        return Totals(sum(t.rows for t in tasks), sum(t.errors for t in tasks), sum(t.tokens for t in tasks))

    def waiting(self) -> Waiting | None:
        """Requests waiting for batch capacity over the tasks that said so lately (None: none);
        the reason is the longest-waiting task's (the executors' routers see the same fleet)."""
        now = time.monotonic()
        with self._lock:
            fresh = [(w.requests, w.waited_s + now - at, w.reason) for w, at in self._waits.values()
                     if now - at <= WAIT_FRESH_S]
        if not fresh:
            return None
        longest = max(fresh, key=lambda w: w[1])
        return Waiting(sum(w[0] for w in fresh), longest[1], longest[2])

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
                waiting = Waiting(int(report.get("waiting", 0)), float(report.get("waited_s", 0.0)),
                                  str(report.get("reason", "")))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not ours: the port is open to the network
            with self._lock:
                self._tasks[task] = totals
                if waiting.requests:
                    self._waits[task] = (waiting, time.monotonic())
                else:
                    self._waits.pop(task, None)


def progress_line(done: Totals, total_rows: int | None, elapsed_s: float, waiting: Waiting | None = None) -> str:
    """`rows 120/1000 (12%)  4.0 rows/s  310 tokens/s  ETA 3m40s  errors 1`, for a terminal; then
    `  waiting for batch capacity: <reason> (3 requests, 12s)` once requests have waited a while."""
    rate = done.rows / elapsed_s if elapsed_s > 0 else 0.0
    tokens = done.tokens / elapsed_s if elapsed_s > 0 else 0.0
    if total_rows:
        share = f"rows {done.rows}/{total_rows} ({100 * done.rows / total_rows:.0f}%)"
        eta = _duration((total_rows - done.rows) / rate) if rate > 0 else "unknown"
        line = f"{share}  {rate:.1f} rows/s  {tokens:.0f} tokens/s  ETA {eta}"
    else:
        line = f"rows {done.rows}  {rate:.1f} rows/s  {tokens:.0f} tokens/s"
    line += f"  errors {done.errors}" if done.errors else ""
    if waiting is not None and waiting.requests and waiting.waited_s >= SHOW_WAIT_AFTER_S:
        line += (f"  waiting for batch capacity: {waiting.reason} ({waiting.requests} requests, "
                 f"{_duration(waiting.waited_s)})")
    return line


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
