"""Gateway throughput with N processes on one port (`gateway --processes N`), N side by side.

    python benchmarks/gateway_scale.py [--processes 1 2] [--seconds 10] [--rounds 2] [--connections 64]

Closed loop: `--connections` keep-alive connections each send short streamed completions
(8 tokens, one event) back to back for `--seconds`; requests/s served, the gateway's CPU per
request (all its processes), and P50/P99 latency to the first token. One mock worker. Rounds
alternate the order of the N values, since a shared machine's load drifts.

On a 2-core machine the worker and this load generator share the cores with the gateway, so N=2
cannot show 2x; the issue's N = 1, 2, 4 check (>= 0.8 N of one process) needs a host with cores
to spare (the GPU host).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gateway_overhead as overhead  # noqa: E402

from vllm_fleet.bench import percentile  # noqa: E402


async def closed_loop(port: int, connections: int, seconds: float, gateway_pid: int) -> dict:
    pool = overhead.HttpPool(port)
    body = overhead.completion_body(8)
    await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter()) for _ in range(connections)))
    conns = list(pool.idle)
    ttfts: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client(conn: overhead.HttpConnection) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            try:
                ttft, _ = await conn.stream("/v1/completions", body, time.perf_counter())
                ttfts.append(ttft)
            except Exception:
                errors += 1
                return

    cpu0 = overhead.cpu_seconds(gateway_pid)
    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - started
    cpu = overhead.cpu_seconds(gateway_pid) - cpu0
    pool.close()
    return {"requests_per_s": len(ttfts) / elapsed, "requests": len(ttfts), "errors": errors,
            "gateway_cpu_us_per_request": cpu / max(len(ttfts), 1) * 1e6, "gateway_cpu_cores": cpu / elapsed,
            "ttft_p50_ms": percentile(ttfts, 50) * 1000, "ttft_p99_ms": percentile(ttfts, 99) * 1000,
            "load_average": os.getloadavg()[0]}


async def one(processes: int, args) -> dict:
    overhead.SETUP["processes"] = processes
    worker = overhead.mock_worker(5, 2000)
    async with worker, overhead.gateway_for(worker) as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        await closed_loop(gateway.port, args.connections, 1.0, gateway.pid)  # warm-up
        return await closed_loop(gateway.port, args.connections, args.seconds, gateway.pid)


async def main(args) -> dict:
    results: dict[int, list[dict]] = {n: [] for n in args.processes}
    for round_ in range(args.rounds):
        for n in (args.processes if round_ % 2 == 0 else args.processes[::-1]):
            point = await one(n, args)
            results[n].append(point)
            print(json.dumps({"round": round_, "processes": n, **point}), flush=True)
    base = sum(p["requests_per_s"] for p in results[args.processes[0]]) / args.rounds
    for n in args.processes:
        mean = sum(p["requests_per_s"] for p in results[n]) / args.rounds
        print(f"N={n}: {mean:,.0f} req/s mean of {args.rounds} rounds = {mean / base:.2f}x N={args.processes[0]} "
              f"(target >= {0.8 * n / args.processes[0]:.1f}x)", flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--src", help="Run this checkout's src/ (PYTHONPATH)")
    parser.add_argument("--json", help="Also write the raw figures to this file")
    options = parser.parse_args()
    overhead.SETUP["src"] = options.src
    figures = overhead.run_on_uvloop(main(options))
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=2))
