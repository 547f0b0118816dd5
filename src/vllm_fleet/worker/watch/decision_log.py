"""One log line per hung-engine check while the engine is silent: what the watch decided and why.

Logged at DEBUG on `vllm_fleet.worker.watch` (run a worker with `--log-level DEBUG` to see it),
only once the engine has been silent for SILENT_FROM_S with requests held, so a healthy engine
logs nothing. Each line carries the monotonic time of the check, so a detection time can be
taken apart after the fact: which ticks were late and not judged, when the busy bound applied
and which process's CPU made it apply.
"""

from __future__ import annotations

import logging
import time

from vllm_fleet.worker.watch.engine_cpu import CpuReading
from vllm_fleet.worker.watch.engine_watch import Check

logger = logging.getLogger("vllm_fleet.worker.watch")

SILENT_FROM_S = 1.0


def log_watch_decision(check: Check | None, cpu: CpuReading | None) -> None:
    if check is None or check.silent_s < SILENT_FROM_S or not logger.isEnabledFor(logging.DEBUG):
        return
    children = " ".join(f"{pid}:{used:.3f}" for pid, used in sorted(cpu.per_child_s.items())) if cpu else "-"
    logger.debug("watch t=%.3f held=%d silent_s=%.2f bound_s=%.2f busy=%s judged=%s late_s=%.2f "
                 "children_cpu_s=%.3f own_cpu_s=%.3f since_children_cpu_s=%.1f per_child=[%s]",
                 time.monotonic(), check.held, check.silent_s, check.bound_s, check.busy, check.judged,
                 check.late_s, cpu.children_s if cpu else 0.0, cpu.own_s if cpu else 0.0,
                 cpu.since_children_s if cpu else 0.0, children)
