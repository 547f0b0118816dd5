"""CPU per streamed token in the gateway and in the worker, one token per SSE event, checkouts side by side.

    python benchmarks/data_path_cpu.py SRC [SRC ...] [--rounds 2] [--streams 200] [--seconds 8]
        [--py-spy DIR]   # also record each process with py-spy (one svg per side and process)

For each `src` (a checkout's src/ folder, PYTHONPATH of the worker and gateway): a mock worker at
a GPU's pace (one token per sequence every 10 ms: 100 tokens/s), the gateway at its default
`--stream-interval-ms 0` (one SSE event per engine step, as `vllm serve` sends them), and
`--streams` concurrent streamed completions of `100 * --seconds` tokens each over keep-alive
connections (the lean client of gateway_overhead.py). Figures per side: tokens, events, the
gateway's and the worker's CPU per token (all threads, /proc), tokens per gateway CPU-second,
tokens/s. Rounds alternate the order of the checkouts, since a shared machine's load drifts.

The mock worker's own pacing (a timer per sequence) costs more than a real engine's batched
step, so its CPU is an upper bound on the worker's per-token work; the py-spy profiles split it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as overhead  # noqa: E402
from gateway_rate_cpu import with_src  # noqa: E402
from proc_stat import children_of, cpu_seconds  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess  # noqa: E402

PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def system_seconds(pid: int) -> float:
    """Kernel CPU time of a process and its live children (the rest of cpu_seconds is user time)."""
    total = 0.0
    for candidate in [pid, *children_of(pid)]:
        try:
            fields = open(f"/proc/{candidate}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[12]) / os.sysconf("SC_CLK_TCK")
    return total


def _py_spy(pid: int, out: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([PY_SPY, "record", "--pid", str(pid), "--rate", "200", "--duration", str(int(seconds)),
                             "--nonblocking", "--gil", "--format", "speedscope", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one_side(src: str, args: argparse.Namespace, label: str) -> dict:
    env = {**overhead.QUIET, **({"PYTHONPATH": with_src(src)} if src else {})}
    tokens_each = int(100 * args.seconds)
    async with WorkerProcess(["--engine", "mock", "--served-model-name", overhead.MODEL, "--mock-ttft-ms", "1",
                              "--mock-tokens-per-s", "100", "--mock-max-model-len", "65536", *args.worker_args], env,
                             stop_grace_s=20) as worker:
        await worker.wait_serving(60)
        async with GatewayProcess(["--workers", worker.address, "--no-access-log", *args.gateway_args], env,
                                  stop_grace_s=20) as gateway:
            await gateway.wait_ready(60)
            pool = overhead.HttpPool(gateway.port)
            # Open the connections (and the stream call) first: not what we measure.
            await asyncio.gather(*(pool.stream("/v1/completions", overhead.completion_body(4), time.perf_counter())
                                   for _ in range(args.streams)))
            events0 = sum(c.events for c in pool.idle)
            spies = []
            if args.py_spy:
                Path(args.py_spy).mkdir(parents=True, exist_ok=True)
                spies = [_py_spy(pid, Path(args.py_spy) / f"{label}-{name}.json", args.seconds * 0.8)
                         for name, pid in (("gateway", gateway.pid), ("worker", worker.pid))]
            g0, w0, started = cpu_seconds(gateway.pid), cpu_seconds(worker.pid), time.perf_counter()
            gs0, ws0 = system_seconds(gateway.pid), system_seconds(worker.pid)
            body = overhead.completion_body(tokens_each)
            results = await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter())
                                             for _ in range(args.streams)))
            elapsed = time.perf_counter() - started
            g_cpu, w_cpu = cpu_seconds(gateway.pid) - g0, cpu_seconds(worker.pid) - w0
            g_sys, w_sys = system_seconds(gateway.pid) - gs0, system_seconds(worker.pid) - ws0
            events = sum(c.events for c in pool.idle) - events0
            pool.close()
            for spy in spies:
                spy.wait(timeout=60)
    tokens = sum(t for _, t in results)
    ttfts = sorted(t for t, _ in results if t is not None)
    return {"tokens": tokens, "events": events, "s": round(elapsed, 2),
            "gateway_cpu_s": round(g_cpu, 2), "gateway_sys_s": round(g_sys, 2),
            "worker_cpu_s": round(w_cpu, 2), "worker_sys_s": round(w_sys, 2),
            "gateway_us_per_token": round(g_cpu / tokens * 1e6, 1), "worker_us_per_token": round(w_cpu / tokens * 1e6, 1),
            "tokens_per_gateway_cpu_s": round(tokens / max(g_cpu, 1e-9)), "tokens_per_s": round(tokens / elapsed),
            "ttft_p50_ms": round(ttfts[len(ttfts) // 2] * 1000, 1) if ttfts else None,
            "load": round(os.getloadavg()[0], 2)}


async def main(args: argparse.Namespace) -> None:
    per_src: dict[str, list[dict]] = {src: [] for src in args.srcs}
    for round_ in range(args.rounds):
        for i, src in enumerate(args.srcs if round_ % 2 == 0 else args.srcs[::-1]):
            label = f"r{round_}-{Path(src).resolve().parent.name}"
            result = await one_side(src, args, label)
            per_src[src].append(result)
            print(json.dumps({"round": round_, "src": src, **result}), flush=True)
    base = args.srcs[0]
    for src in args.srcs:
        mean = lambda key, s=src: sum(r[key] for r in per_src[s]) / len(per_src[s])  # noqa: E731
        print(f"{src}: gateway {mean('gateway_us_per_token'):.1f} us/token "
              f"({mean('tokens_per_gateway_cpu_s'):,.0f} tokens per gateway CPU-s, "
              f"{mean('tokens_per_gateway_cpu_s') / (sum(r['tokens_per_gateway_cpu_s'] for r in per_src[base]) / len(per_src[base])):.2f}x "
              f"{base}); worker {mean('worker_us_per_token'):.1f} us/token", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("srcs", nargs="+", help="src/ folders of the checkouts to compare (the first is the base)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8.0, help="stream length: 100 tokens per second")
    parser.add_argument("--py-spy", help="record both processes of each side with py-spy into this folder")
    parser.add_argument("--gateway-arg", dest="gateway_args", action="append", default=[],
                        help="extra gateway argument (repeat)")
    parser.add_argument("--worker-arg", dest="worker_args", action="append", default=[],
                        help="extra mock worker argument (repeat), e.g. --worker-arg=--mock-batched-steps")
    overhead.run_on_uvloop(main(parser.parse_args()))
