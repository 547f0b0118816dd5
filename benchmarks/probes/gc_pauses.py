"""Garbage-collector pauses of a benchmarked gateway and of the load generator itself.

The gateway runs with gc_probe/ on its PYTHONPATH (`probe_env`), which appends each of its
collections of 1 ms or more to LOG; `watch_own_collector` settles and watches this process's
own collector. `pauses_between` counts both within a measured window, so that a slow request can
be told apart from a collector pause on either side.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

from vllm_fleet.heap import settle_garbage_collector

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gc_probe")
LOG = os.path.join(tempfile.gettempdir(), f"vllm-fleet-gateway-gc-{os.getpid()}.log")
# This load generator's own collections of 1 ms or more: (time.time(), milliseconds).
_OWN: list[tuple[float, float]] = []


def probe_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a gateway whose collections of 1 ms or more are logged to LOG."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), PROBE) if p),
            "VLLM_FLEET_GC_LOG": LOG}


def watch_own_collector() -> None:
    """Settle this process's collector (as the gateway does its own) and note its longer pauses:
    a pause here delays the client's clock readings and would pose as gateway latency."""
    settle_garbage_collector()
    started = [0.0]

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif (paused := time.perf_counter() - started[0]) >= 0.001:
            _OWN.append((time.time(), paused * 1000))

    gc.callbacks.append(on_collection)


def pauses_between(since: float, until: float) -> dict:
    """The gateway's collections of 1 ms or more between two time.time() readings, and the
    load generator's own."""
    own = [ms for at, ms in _OWN if since <= at <= until]
    pauses = []
    if os.path.exists(LOG):
        with open(LOG) as log:
            for line in log:
                at, generation, ms = line.split()
                if since <= float(at) <= until:
                    pauses.append((int(generation), float(ms)))
    return {"gc_pauses": len(pauses), "gc_pause_max_ms": max((ms for _, ms in pauses), default=0.0),
            "gc_full_collections": sum(1 for generation, _ in pauses if generation == 2),
            "client_gc_pauses": len(own), "client_gc_pause_max_ms": max(own, default=0.0)}


def remove_log() -> None:
    if os.path.exists(LOG):
        os.remove(LOG)
