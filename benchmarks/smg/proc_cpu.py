"""CPU of the processes on each side of the SMG comparison, from /proc (Linux): a gateway's whole
tree, and an engine's split by role (front process, vLLM's EngineCore, the model worker)."""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of the whole process (every thread, live or exited), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except OSError:
            pass
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def engine_cpu(root: int) -> dict[str, float]:
    """An engine's CPU by role: the process that serves gRPC ("front": our worker or vLLM's
    grpc_server, tokenizing and detokenizing), vLLM's EngineCore (scheduler, and the busy-poll
    of its shared-memory queues), the model worker (the forward passes), anything else."""
    roles = {"front": _cpu_s(root), "engine_core": 0.0, "model_worker": 0.0, "other": 0.0}
    stack = _children(root)
    while stack:
        pid = stack.pop()
        title = _cmdline(pid)
        role = "engine_core" if "EngineCore" in title else "model_worker" if "VLLM::Worker" in title else "other"
        roles[role] += _cpu_s(pid)
        stack += _children(pid)
    return roles


def tree_cpu(root: int) -> float:
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += _cpu_s(pid)
        stack += _children(pid)
    return total
