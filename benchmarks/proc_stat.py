"""CPU time and context switches of a process, from /proc (Linux), for the gateway benchmarks."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> list[str]:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) and of its live children
    (`--processes N`: the gateway processes under the parent), from /proc."""
    total = 0.0
    for candidate in [pid, *children_of(pid)]:
        try:
            fields = _stat(candidate)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat(int(entry))[1]) == pid:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of a process's live threads, from /proc: each
    one a thread that slept and woke, which is where a streamed message's CPU goes on a VM."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return total
