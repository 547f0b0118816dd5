"""What the routing core adds on top of a bare gRPC client: TTFT and chunk throughput.

    python benchmarks/router_overhead.py [--requests 400 --streams 32 --tokens 400]

One mock worker (the named stand-in engine, no model), one process holding both a bare
WorkerClient and a Router (policy least_outstanding) over that worker, as a gateway would:

1. TTFT, one request at a time (max_tokens=1), direct and routed alternating so both see the
   same machine state: P50/P99 of each and of the difference.
2. Chunk throughput (median of `--rounds` alternating rounds): `--streams` concurrent streams of `--tokens` tokens at the mock's 100
   tokens/s, one chunk per token (no coalescing), direct then routed: chunks/s and the
   routed/direct ratio (1.0 = the router keeps up with everything the worker sends).
3. The router's own CPU per chunk: a stand-in client that yields chunks at no cost, iterated
   directly and through router.stream() of a second Router over the same worker whose
   `connect` returns the stand-in (the machine-noise-free figure behind 2).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
from prometheus_client import CollectorRegistry

from vllm_fleet.bench import percentile
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import Chunk, GenerateInput, GenerateRequest, Usage
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig


def mock_worker() -> WorkerProcess:
    return WorkerProcess(["--engine", "mock", "--mock-ttft-ms", "0", "--mock-tokens-per-s", "100"],
                         {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, stop_grace_s=15)


def request(rid: str, max_tokens: int) -> GenerateRequest:
    return build_request(rid, [GenerateInput(text=f"benchmark prompt {rid}")], SamplingParams(max_tokens=max_tokens))


async def ttft(source, req: GenerateRequest) -> float:
    started = time.perf_counter()
    first = None
    stream = source(req)
    try:
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - started
    finally:
        await stream.aclose()
    return first


async def chunks_per_s(source, streams: int, tokens: int, tag: str) -> float:
    async def one(i: int) -> int:
        count = 0
        stream = source(request(f"{tag}-{i}", tokens))
        try:
            async for _ in stream:
                count += 1
        finally:
            await stream.aclose()
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(counts) / (time.perf_counter() - started)


class InstantClient:
    """A stand-in WorkerClient whose chunks cost nothing: what is left is the router's own work."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    async def generate(self, request: GenerateRequest, *, timeout: float | None = None):
        for i in range(self.tokens):
            last = i == self.tokens - 1
            yield Chunk(0, 0, " x", [7], finish_reason="length" if last else None,
                        usage=Usage(3, self.tokens, 0) if last else None)


async def router_us_per_chunk(address: str, tokens: int = 20_000, rounds: int = 5) -> tuple[float, float]:
    """Microseconds per chunk iterating the stand-in directly, and through router.stream()."""
    fake = InstantClient(tokens)
    # Its own Router, so only this measurement sees the stand-in; health and Load still come
    # from the real worker, which keeps it in rotation.
    router = Router(StaticRegistry.from_spec(address), RouterConfig(), metrics_registry=CollectorRegistry(),
                    connect=lambda a: fake)
    bare, routed = [], []
    try:
        await router.start()
        await router.wait_ready(timeout=30)
        for i in range(rounds):
            started = time.perf_counter()
            async for _ in fake.generate(request(f"bare{i}", tokens)):
                pass
            bare.append((time.perf_counter() - started) / tokens * 1e6)
            started = time.perf_counter()
            async for _ in router.stream(request(f"cpu{i}", tokens)):
                pass
            routed.append((time.perf_counter() - started) / tokens * 1e6)
    finally:
        await router.close()
    return float(np.median(bare)), float(np.median(routed))


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


async def main(args: argparse.Namespace) -> None:
    worker = mock_worker().start()
    address = worker.address
    client = WorkerClient(address)
    router = Router(StaticRegistry.from_spec(address), RouterConfig())
    try:
        await worker.wait_serving(60)
        await router.start()
        await router.wait_ready(timeout=30)
        direct = lambda r: client.generate(r, timeout=60)  # noqa: E731
        routed = router.stream
        for i in range(20):  # warm both paths
            await ttft(direct, request(f"warm-d{i}", 1))
            await ttft(routed, request(f"warm-r{i}", 1))
        d_ttft, r_ttft = [], []
        for i in range(args.requests):
            d_ttft.append(await ttft(direct, request(f"d{i}", 1)))
            r_ttft.append(await ttft(routed, request(f"r{i}", 1)))
        d_rates, r_rates = [], []
        for round_ in range(args.rounds):  # alternate, so both paths see the same machine state
            d_rates.append(await chunks_per_s(direct, args.streams, args.tokens, f"sd{round_}"))
            r_rates.append(await chunks_per_s(routed, args.streams, args.tokens, f"sr{round_}"))
        d_rate, r_rate = float(np.median(d_rates)), float(np.median(r_rates))
        bare_us, routed_us = await router_us_per_chunk(address)
    finally:
        await router.close()
        await client.close()
        await worker.astop()
    diff = [r - d for r, d in zip(r_ttft, d_ttft)]
    print(f"TTFT over {args.requests} sequential requests (mock worker, TTFT 0 ms):")
    print(f"  direct  P50 {pct(d_ttft, 50):.2f} ms  P99 {pct(d_ttft, 99):.2f} ms")
    print(f"  routed  P50 {pct(r_ttft, 50):.2f} ms  P99 {pct(r_ttft, 99):.2f} ms")
    print(f"  added   P50 {pct(diff, 50):.2f} ms  (paired difference)")
    print(f"chunk throughput, {args.streams} streams x {args.tokens} tokens, one chunk per token, "
          f"median of {args.rounds} alternating rounds:")
    print(f"  direct {d_rate:,.0f} chunks/s  routed {r_rate:,.0f} chunks/s  ratio {r_rate / d_rate:.2f}")
    print("router CPU per chunk (in-process stand-in client, no network; median of 5 x 20,000 chunks):")
    print(f"  bare iteration {bare_us:.2f} us  through router.stream {routed_us:.2f} us  "
          f"router adds {routed_us - bare_us:.2f} us per chunk")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="Sequential requests per path for TTFT")
    parser.add_argument("--streams", type=int, default=64, help="Concurrent streams for the throughput figure")
    parser.add_argument("--tokens", type=int, default=200, help="Tokens per stream for the throughput figure")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating direct/routed throughput rounds")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
