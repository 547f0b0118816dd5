"""Gateway CPU spent on polling its workers, idle and under a light stream load, for checkouts side by side.

    python benchmarks/probes/gateway_poll_cpu.py OLD/src NEW/src [--rounds 2] [--idle-s 20] [--busy-s 15]
    python benchmarks/probes/gateway_poll_cpu.py src@GRPC_EXPERIMENTS= src   # one checkout, the gateway's env differs

A side is `SRC` or `SRC@NAME=VALUE`: the variable is set in that side's gateway only (its workers
are the same on both sides).

For each `src` (a checkout's src/ folder: PYTHONPATH of its workers and gateway): two mock
workers and one gateway in front (default poll intervals: Load every 0.5 s, health every 1 s).
1. idle: the gateway's CPU per second with no traffic, which is polls and timers only, and each
   worker's (what answering the polls, or pushing Loads, costs it);
2. busy: 16 streams at one token per ~100 ms each (the pace of a CPU engine's steps), one token
   per SSE event, for `--busy-s`: the gateway's CPU per second and per event received.
Both sides stream the same tokens (checked). Rounds alternate the order of the checkouts, since
the machine's load drifts; /proc counts 10 ms ticks, so keep the windows long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared helpers
from gateway_overhead import QUIET, HttpPool, completion_body  # noqa: E402
from proc_stat import context_switches, cpu_seconds  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess  # noqa: E402

STREAMS = 16
TOKENS_PER_S = 10  # per stream: one token per ~100 ms, one token per event


async def one_side(side: str, idle_s: float, busy_s: float) -> dict:
    src, _, setting = side.partition("@")
    env = {**QUIET, "PYTHONPATH": str(Path(src).resolve())}
    gateway_env = dict([setting.split("=", 1)]) if setting else {}
    workers = [WorkerProcess(["--engine", "mock", "--served-model-name", "mock-bench", "--mock-ttft-ms", "1",
                              "--mock-tokens-per-s", str(TOKENS_PER_S), "--mock-max-model-len", "65536"], env,
                             stop_grace_s=15) for _ in range(2)]
    for worker in workers:
        await worker.__aenter__()
    try:
        for worker in workers:
            await worker.wait_serving(60)
        async with GatewayProcess(["--workers", ",".join(w.address for w in workers), "--no-access-log",
                                   "--stream-interval-ms", "0"], {**env, **gateway_env},
                                  stop_grace_s=15) as gateway:
            await gateway.wait_ready(60)
            pool = HttpPool(gateway.port)
            # Open the connections (and the workers' stream calls) before measuring.
            await asyncio.gather(*(pool.stream("/v1/completions", completion_body(5), time.perf_counter())
                                   for _ in range(STREAMS)))
            cpu0, workers0 = cpu_seconds(gateway.pid), [cpu_seconds(w.pid) for w in workers]
            await asyncio.sleep(idle_s)
            idle = (cpu_seconds(gateway.pid) - cpu0) / idle_s
            workers_idle = [(cpu_seconds(w.pid) - c) / idle_s for w, c in zip(workers, workers0)]
            body = completion_body(int(busy_s * TOKENS_PER_S))
            cpu0, events0, started = cpu_seconds(gateway.pid), sum(c.events for c in pool.idle), time.perf_counter()
            switches0 = context_switches(gateway.pid)
            results = await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter())
                                             for _ in range(STREAMS)))
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(gateway.pid) - cpu0
            switches = context_switches(gateway.pid) - switches0
            events = sum(c.events for c in pool.idle) - events0
            pool.close()
    finally:
        for worker in workers:
            await worker.__aexit__(None, None, None)
    return {"src": side, "idle_cpu_ms_per_s": round(idle * 1000, 2),
            "workers_idle_cpu_ms_per_s": [round(w * 1000, 2) for w in workers_idle],
            "tokens": sum(t for _, t in results),
            "events": events, "busy_cpu_ms_per_s": round(cpu / elapsed * 1000, 1),
            "us_per_event": round(cpu / max(events, 1) * 1e6, 1),
            "switches_per_event": round(switches / max(events, 1), 2), "load_1m": round(os.getloadavg()[0], 2)}


async def main(args) -> None:
    rows = []
    for round_ in range(args.rounds):
        for src in (args.srcs if round_ % 2 == 0 else args.srcs[::-1]):
            row = {"round": round_ + 1, **await one_side(src, args.idle_s, args.busy_s)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    tokens = {row["tokens"] for row in rows}
    assert len(tokens) == 1, f"the sides streamed different tokens: {tokens}"
    print("\n| src | idle CPU ms/s (rounds) | each worker's idle CPU ms/s | busy CPU ms/s | gateway µs per event "
          "| context switches per event | tokens |\n|---|---|---|---|---|---|---:|")
    for src in args.srcs:
        mine = [r for r in rows if r["src"] == src]
        print(f"| {src} | {' / '.join(str(r['idle_cpu_ms_per_s']) for r in mine)} | "
              f"{' / '.join(' + '.join(str(w) for w in r['workers_idle_cpu_ms_per_s']) for r in mine)} | "
              f"{' / '.join(str(r['busy_cpu_ms_per_s']) for r in mine)} | "
              f"{' / '.join(str(r['us_per_event']) for r in mine)} | "
              f"{' / '.join(str(r['switches_per_event']) for r in mine)} | {mine[0]['tokens']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("srcs", nargs="+", help="src/ folders of the checkouts to compare, each optionally @NAME=VALUE")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--busy-s", type=float, default=15.0)
    asyncio.run(main(parser.parse_args()))
