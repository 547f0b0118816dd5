"""Where the gateway's CPU goes, per request and per SSE event: py-spy under load, by component.

    python benchmarks/probes/gateway_profile.py --out benchmarks/results/gateway-cpu-DATE [--src SRC] [--seconds 12]

Two loads on a mock worker, each with py-spy sampling the gateway process (`--nonblocking`, raw
folded stacks, idle frames left out, so every sample is CPU the gateway spent):

1. requests: an open loop of short streamed completions (8 tokens) at `--rate` req/s;
2. events: `--streams` concurrent streams at one token per SSE event (mock worker at 100 tokens/s
   per sequence, i.e. one token per ~10 ms engine step; gateway `--stream-interval-ms 0`).

Each sample is put in one component by its innermost frame that belongs to one (table below);
a component's share of the samples times the gateway's CPU seconds (from /proc, all threads)
over the requests (or events) served is its microseconds per request (or per event). `--src`
runs another checkout's src/ (PYTHONPATH) to profile before and after the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the shared helpers
from gateway_overhead import HttpPool, QUIET, completion_body, open_loop  # noqa: E402
from proc_stat import cpu_seconds  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess  # noqa: E402

PY_SPY = str(Path(sys.executable).parent / "py-spy")
# (component, pattern on "function (file:line)"): the innermost frame matching any pattern wins.
COMPONENTS = [
    ("metrics (prometheus)", r"prometheus_client|gateway/metrics\.py"),
    ("logging", r"\(logging/|access_log\.py|vllm_fleet/logs\.py"),
    ("body JSON + pydantic validation", r"pydantic|json/decoder|translate\.py:\d+\)$|parse_body|schemas\.py"),
    ("field table (fields/forward)", r"gateway/fields\.py|gateway/forward\.py"),
    ("plan (translate)", r"gateway/translate\.py"),
    ("gRPC client: C-core poller thread", r"^Thread\.run \(threading\.py"),
    ("gRPC client (grpc, protobuf, mux)", r"\(grpc/|_cython|protobuf|client/mux\.py|client/worker_client\.py|"
                                          r"protocol/convert\.py|protocol/types\.py"),
    ("router admission/pick", r"router/admission\.py|router/router\.py|router/balancer|router/pick|router/pool|"
                              r"router/breaker|router/quota"),
    ("router stream (retry/migration loop)", r"router/stream\.py|router/"),
    ("chunk -> SSE JSON", r"gateway/sse\.py|gateway/formats\.py|gateway/aggregate\.py|json/encoder|orjson"),
    ("HTTP write (uvicorn send, transport)", r"RequestResponseCycle\.send|StreamResponse\.send|Response\.send"),
    ("HTTP parse + ASGI (uvicorn, httptools)", r"uvicorn|httptools|header_limit\.py|from_scope|gateway/asgi\.py"),
    ("request handling (app, completions)", r"gateway/app\.py|gateway/completions\.py|gateway/call\.py"),
    ("asyncio loop, tasks, queues", r"asyncio|uvloop"),
]


def component(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, pattern in COMPONENTS:
            if re.search(pattern, frame):
                return name
    return "other"


def breakdown(raw: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            name = component(stack)
            counts[name] = counts.get(name, 0) + int(n)
    return counts


def profile(pid: int, seconds: float, raw: Path) -> subprocess.Popen:
    return subprocess.Popen([PY_SPY, "record", "-p", str(pid), "-f", "raw", "-o", str(raw), "-d", str(int(seconds)),
                             "-r", "250", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def env_for(src: str | None) -> dict[str, str]:
    return {**QUIET, **({"PYTHONPATH": src} if src else {})}


def worker_env(args) -> dict[str, str]:
    return env_for(args.worker_src or args.src)


async def requests_phase(args, out: Path) -> dict:
    worker = WorkerProcess(["--engine", "mock", "--served-model-name", "mock-bench", "--mock-ttft-ms", "5",
                            "--mock-tokens-per-s", "2000"], worker_env(args), stop_grace_s=15)
    async with worker, GatewayProcess(["--workers", worker.address, "--no-access-log", *args.gateway_arg],
                                      env_for(args.src),
                                      stop_grace_s=15) as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        pool = HttpPool(gateway.port)
        body = completion_body(8)

        async def send():
            ttft, _ = await pool.stream("/v1/completions", body, time.perf_counter())
            return ttft

        await open_loop(50, 1.0, send)  # warm-up
        spy = profile(gateway.pid, args.seconds, out / f"{args.tag}-requests.raw")
        cpu0 = cpu_seconds(gateway.pid)
        ttfts, errors, rate = await open_loop(args.rate, args.seconds, send)
        cpu = cpu_seconds(gateway.pid) - cpu0
        spy.wait(60)
        pool.close()
    served = len(ttfts) + errors
    return {"requests": served, "errors": errors, "rate": rate, "gateway_cpu_s": cpu,
            "us_per_request": cpu / served * 1e6}


async def events_phase(args, out: Path) -> dict:
    worker = WorkerProcess(["--engine", "mock", "--served-model-name", "mock-bench", "--mock-ttft-ms", "1",
                            "--mock-tokens-per-s", "100", "--mock-max-model-len", "65536"], worker_env(args),
                           stop_grace_s=15)
    async with worker, GatewayProcess(["--workers", worker.address, "--no-access-log", "--stream-interval-ms", "0",
                                       *args.gateway_arg],
                                      env_for(args.src), stop_grace_s=15) as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        pool = HttpPool(gateway.port)
        tokens = int(args.seconds * 100)
        body = completion_body(tokens)
        await asyncio.gather(*(pool.stream("/v1/completions", completion_body(20), time.perf_counter())
                               for _ in range(args.streams)))  # warm-up: open the connections
        spy = profile(gateway.pid, args.seconds, out / f"{args.tag}-events.raw")
        cpu0 = cpu_seconds(gateway.pid)
        events0 = sum(c.events for c in pool.idle)
        started = time.perf_counter()
        results = await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter())
                                         for _ in range(args.streams)))
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(gateway.pid) - cpu0
        events = sum(c.events for c in pool.idle) - events0
        spy.wait(60)
        pool.close()
    streamed = sum(t for _, t in results)
    return {"streams": args.streams, "tokens": streamed, "events": events, "seconds": elapsed,
            "tokens_per_s": streamed / elapsed, "gateway_cpu_s": cpu, "us_per_event": cpu / max(events, 1) * 1e6,
            "tokens_per_gateway_cpu_s": streamed / max(cpu, 1e-9)}


def table(counts: dict[str, int], us_total: float, unit: str) -> list[str]:
    total = sum(counts.values()) or 1
    lines = [f"| component | samples | share | us per {unit} |", "|---|---:|---:|---:|"]
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {n} | {n / total:.1%} | {us_total * n / total:.1f} |")
    lines.append(f"| **total** (CPU from /proc) | {total} | 100% | {us_total:.1f} |")
    return lines


async def main(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"requests": await requests_phase(args, out), "events": await events_phase(args, out),
               "load_average": os.getloadavg()[0], "src": args.src or "this checkout"}
    lines = [f"# {args.tag}: {figures['src']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"load {figures['load_average']:.1f}",
             f"requests: {json.dumps(figures['requests'])}", *table(
                 breakdown(out / f"{args.tag}-requests.raw"), figures["requests"]["us_per_request"], "request"),
             f"events (one token per SSE event): {json.dumps(figures['events'])}", *table(
                 breakdown(out / f"{args.tag}-events.raw"), figures["events"]["us_per_event"], "event")]
    (out / f"{args.tag}-profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="Folder for the raw py-spy profiles and the tables")
    parser.add_argument("--src", help="Run this checkout's src/ (PYTHONPATH) instead of the installed package")
    parser.add_argument("--worker-src", help="Run the mock worker from this src/ (default: as --src)")
    parser.add_argument("--tag", default="after", help="Name prefix of the output files")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--gateway-arg", action="append", default=[], help="An extra gateway argument (repeatable)")
    parser.add_argument("--rate", type=float, default=300.0, help="Requests per second of the requests load")
    parser.add_argument("--streams", type=int, default=100, help="Concurrent streams of the events load")
    asyncio.run(main(parser.parse_args()))
