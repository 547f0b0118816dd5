"""Logs the garbage collector's pauses of a process that has this folder on its PYTHONPATH.

Set VLLM_FLEET_GC_LOG=FILE: every collection of 1 ms or longer appends one line, "<unix time>
<generation> <milliseconds>", to FILE, written after the pause so that it never lengthens one.
benchmarks/gateway_overhead.py puts the gateway under it to tell which slow requests met a pause.
"""

import gc
import os
import time

_PATH = os.environ.get("VLLM_FLEET_GC_LOG")
_MIN_S = 0.001

if _PATH:
    _started = [0.0]

    def _on_collection(phase: str, info: dict) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        paused = time.perf_counter() - _started[0]
        if paused >= _MIN_S:
            with open(_PATH, "a") as log:
                log.write(f"{time.time():.6f} {info['generation']} {paused * 1000:.2f}\n")

    gc.callbacks.append(_on_collection)
