"""Gateway CPU per streamed SSE event, for one or more checkouts side by side.

    python benchmarks/gateway_stream_cpu.py src /path/to/old/checkout/src [--rounds 3] [--streams 64]

For each `src` (a checkout's src/ folder, given to the worker and gateway as PYTHONPATH): a
mock worker streaming 20,000 tokens/s per sequence, a gateway coalescing every 20 ms, 64
streams of 60,000 tokens through it; the gateway's CPU time (all threads, /proc) over the
SSE events it sent. Rounds alternate the order of the checkouts, since the machine's load drifts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the shared helpers
from gateway_overhead import QUIET  # noqa: E402
from proc_stat import cpu_seconds  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess  # noqa: E402

WARMUP_STREAMS, WARMUP_TOKENS = 4, 2000


async def one_side(src: str, streams: int, tokens: int) -> dict:
    env = {**QUIET, "PYTHONPATH": str(Path(src).resolve())}
    async with WorkerProcess(["--engine", "mock", "--served-model-name", "m", "--mock-ttft-ms", "1",
                              "--mock-tokens-per-s", "20000", "--mock-max-model-len", "1000000"], env,
                             stop_grace_s=20) as worker:
        await worker.wait_serving(60)
        async with GatewayProcess(["--workers", worker.address, "--no-access-log", "--stream-interval-ms", "20"],
                                  env, stop_grace_s=20) as gateway:
            await gateway.wait_ready(60)
            async with aiohttp.ClientSession() as session:
                async def stream(n: int) -> int:
                    body = {"model": "m", "prompt": "hello", "max_tokens": n, "stream": True}
                    events = 0
                    async with session.post(f"{gateway.url}/v1/completions", json=body) as response:
                        async for line in response.content:
                            if line.startswith(b"data: {"):
                                events += 1
                    return events

                # Open the connections (and the worker's stream calls) before measuring.
                await asyncio.gather(*(stream(WARMUP_TOKENS) for _ in range(WARMUP_STREAMS)))
                cpu0, started = cpu_seconds(gateway.pid), time.perf_counter()
                events = sum(await asyncio.gather(*(stream(tokens) for _ in range(streams))))
                elapsed, cpu = time.perf_counter() - started, cpu_seconds(gateway.pid) - cpu0
    return {"tokens": streams * tokens, "events": events, "s": round(elapsed, 2), "gw_cpu_s": round(cpu, 2),
            "us_per_event": round(cpu / events * 1e6, 1), "tokens_per_cpu_s": round(streams * tokens / cpu)}


async def main(args: argparse.Namespace) -> None:
    for round_ in range(args.rounds):
        for src in (args.srcs if round_ % 2 == 0 else args.srcs[::-1]):
            result = await one_side(src, args.streams, args.tokens)
            print(round_, src, json.dumps(result), "load", round(os.getloadavg()[0], 2), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("srcs", nargs="+", help="src/ folders of the checkouts to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=60000, help="tokens per stream")
    asyncio.run(main(parser.parse_args()))
