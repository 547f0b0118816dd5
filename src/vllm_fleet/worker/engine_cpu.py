"""Whether the engine's own processes are using CPU: a slow engine step, not a hang.

vLLM runs its EngineCore in child processes of the worker (multiprocessing). A stopped or
blocked EngineCore (SIGSTOP, a lock, a dead device it waits on in the kernel) uses no CPU; one
working on a long step does. engine_watch.py uses this to tell the two apart.
"""

from __future__ import annotations

import multiprocessing
import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # gone, or not Linux
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class EngineCpu:
    """`advanced()`: the engine processes used more than `min_cpu_s` of CPU since the last call."""

    def __init__(self, min_cpu_s: float = 0.05) -> None:
        self.min_cpu_s = min_cpu_s
        self._last: dict[int, float] = {}

    def advanced(self) -> bool:
        now = {child.pid: _cpu_seconds(child.pid) for child in multiprocessing.active_children()
               if child.pid is not None}
        used = sum(cpu - self._last.get(pid, cpu) for pid, cpu in now.items())
        self._last = now
        return used > self.min_cpu_s
