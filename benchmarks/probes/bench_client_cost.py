"""CPU the load generator itself spends per streamed SSE event (`vllm-fleet bench`, HTTP target).

A bench that saturates its own core measures itself: on the H200 the HTTP bench client used a
whole core at ~10,000 events/s (RESULTS.md, "GPU (H200)"). This starts a mock worker and our
gateway, runs `vllm-fleet bench --rate inf` against the gateway with the code under each --src
(rounds alternating), and divides the bench process's CPU time (user + system, from
RUSAGE_CHILDREN) by the events it received (one per token: the mock sends one token per step).

    python benchmarks/probes/bench_client_cost.py --src src --src /tmp/old-checkout/src --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.processes import GatewayProcess, exit_on_sigterm

HERE = Path(__file__).resolve().parents[1]


async def ready(worker: WorkerProcess, gateway: GatewayProcess) -> None:
    await worker.wait_serving(60)
    await gateway.wait_ready(60)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(src: str, url: str, args: argparse.Namespace, out: Path) -> tuple[float, int, float]:
    env = {**os.environ, "PYTHONPATH": src}
    before, started = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "bench", "--target", url, "--workload", "random",
                    "--input-len", "8", "--output-len", str(args.tokens), "--rate", "inf",
                    "--num-requests", str(args.streams), "--warmup-requests", "0", "--no-progress",
                    "--output", str(out)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed, used = time.perf_counter() - started, children_cpu() - before
    [run] = json.loads(out.read_text())["runs"]
    events = sum(len(r.get("chunk_times") or []) for r in run["requests"])
    return used, events, elapsed


def main(args: argparse.Namespace) -> None:
    # The worker and gateway run this checkout's code; only the bench's code varies by --src.
    env = {"PYTHONPATH": str(HERE / "src")}
    worker = WorkerProcess(["--engine", "mock", "--mock-tokens-per-s", str(args.tokens_per_s), "--mock-ttft-ms", "1"],
                           env)
    gateway = GatewayProcess(["--workers", worker.address, "--no-access-log"], env)
    results: dict[str, list[tuple[float, float]]] = {src: [] for src in args.src}
    with worker, gateway:
        asyncio.run(ready(worker, gateway))
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for src in (args.src if r % 2 == 0 else args.src[::-1]):
                    used, events, elapsed = one_round(src, gateway.url, args, Path(tmp) / "report.json")
                    results[src].append((used / events * 1e6, events / elapsed))
                    print(f"round {r} {src}: {events} events in {elapsed:.1f} s, bench CPU {used:.1f} s = "
                          f"{used / events * 1e6:.1f} µs/event  (load {os.getloadavg()[0]:.1f})", flush=True)
    print("\n| bench code | bench CPU µs per event (median) | events/s (median) |\n|---|---|---|")
    for src, rows in results.items():
        print(f"| {src} | {statistics.median(r[0] for r in rows):.1f} | {statistics.median(r[1] for r in rows):,.0f} |")
    if len(args.src) == 2:
        a, b = (statistics.median(r[0] for r in results[s]) for s in args.src)
        print(f"\nbench CPU per event, {args.src[0]} / {args.src[1]}: {a / b:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--tokens-per-s", type=float, default=40.0, help="per stream (one event per token)")
    parser.add_argument("--src", action="append", help="PYTHONPATH of the bench's code (repeat to compare); default src")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.src = args.src or [str(HERE / "src")]
    exit_on_sigterm()
    main(args)
