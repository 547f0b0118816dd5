"""What the gateway adds: TTFT overhead vs the worker directly, top sustainable rate, streamed tokens/s.

    python benchmarks/gateway_overhead.py [--quick]

One run, on mock workers (the named stand-in engine: fixed TTFT, set token pace), three figures:

1. Added TTFT at 200 req/s (open loop, Poisson): P50/P99 of time-to-first-token through the
   gateway minus the same percentile straight to the worker over gRPC, same rate, same run.
2. The highest rate one gateway process sustains with P99 added TTFT <= 10 ms (a rate sweep,
   each rate compared with a direct run at that rate).
3. Streamed tokens/s through one gateway process: many long streams from a fast mock worker,
   worker-side coalescing (--stream-interval-ms), counted from each stream's final usage.

The load generator (this process: a lean HTTP/1.1 keep-alive client, so that client cost does
not pose as gateway cost; gRPC via our WorkerClient for the direct runs) is a separate process
from the gateway and the worker. On a 2-core machine all three share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time

from vllm_fleet.bench import ArrivalProcess, percentile
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.processes import GatewayProcess
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, SamplingParams

MODEL = "mock-bench"
PROMPT = "tell me about the river and the mountain"
ERRORS: dict[str, int] = {}
QUIET = {"VLLM_FLEET_LOG_LEVEL": "WARNING"}  # the worker's and gateway's own logging is not what we measure


def mock_worker(ttft_ms: int, tokens_per_s: int, *extra: str) -> WorkerProcess:
    return WorkerProcess(["--engine", "mock", "--served-model-name", MODEL, "--mock-ttft-ms", str(ttft_ms),
                          "--mock-tokens-per-s", str(tokens_per_s), *extra], QUIET, stop_grace_s=15)


def gateway_for(worker: WorkerProcess, *extra: str) -> GatewayProcess:
    return GatewayProcess(["--workers", worker.address, "--no-access-log", *extra], QUIET, stop_grace_s=15)


class HttpConnection:
    """A minimal HTTP/1.1 keep-alive client: just enough for SSE from our gateway."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.answered = False  # whether the current request got a status line
        self.events = 0  # SSE data events received over this connection

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def _head(self) -> tuple[int, dict[bytes, bytes]]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers

    async def stream(self, path: str, body: bytes, started: float) -> tuple[float | None, int]:
        """POST a streaming request; (time to first content event, completion tokens from usage)."""
        self.writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.answered = False
        status, headers = await self._head()
        self.answered = True
        if status != 200:
            await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
            raise RuntimeError(f"HTTP {status}")
        ttft, tokens, pending = None, 0, b""
        while True:  # chunked transfer encoding
            size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return ttft, tokens
            self.events += data.count(b"data: {")
            if ttft is None and b'"text":"' in data and b'"text":""' not in data:
                ttft = time.perf_counter() - started
            pending += data[:-2]
            if b'"usage":{' in pending:
                usage = pending[pending.index(b'"usage":{') + 8:]
                tokens = json.loads(usage[:usage.index(b"}") + 1])["completion_tokens"]
            if b"data: [DONE]" in pending:
                pending = b""
            elif len(pending) > 4096:
                pending = pending[-4096:]


class HttpPool:
    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[HttpConnection] = []

    async def stream(self, path: str, body: bytes, started: float) -> tuple[float | None, int]:
        while self.idle:
            # The server closes idle keep-alive connections (uvicorn: after 5 s); a reused one may
            # be dead before it answers a byte. Like any HTTP client pool, retry on a fresh one.
            conn = self.idle.pop()
            try:
                result = await conn.stream(path, body, started)
            except (asyncio.IncompleteReadError, ConnectionError):
                conn.close()
                if conn.answered:
                    raise
                continue
            self.idle.append(conn)
            return result
        conn = HttpConnection("127.0.0.1", self.port)
        await conn.open()
        try:
            result = await conn.stream(path, body, started)
        except BaseException:
            conn.close()
            raise
        self.idle.append(conn)
        return result

    def close(self) -> None:
        for conn in self.idle:
            conn.close()


async def open_loop(rate: float, duration: float, send) -> tuple[list[float], int, float]:
    """Send at Poisson arrivals for `duration` s; (TTFTs, errors, achieved rate)."""
    times = ArrivalProcess(rate, seed=int(rate)).times(max(1, int(rate * duration)))
    ttfts: list[float] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        try:
            ttft = await send()
            if ttft is None:
                errors += 1
            else:
                ttfts.append(ttft)
        except Exception as exc:
            errors += 1
            ERRORS[f"{type(exc).__name__}: {str(exc)[:80]}"] = ERRORS.get(f"{type(exc).__name__}: {str(exc)[:80]}", 0) + 1

    start = time.perf_counter()
    tasks = []
    for planned in times:
        delay = start + planned - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one()))
    sent_over = time.perf_counter() - start
    await asyncio.gather(*tasks)
    return ttfts, errors, len(times) / max(sent_over, 1e-9)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def completion_body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


async def ttft_pair(rate: float, duration: float, pool: HttpPool, worker: WorkerClient, gateway_pid: int) -> dict:
    body = completion_body(8)
    counter = iter(range(10**9))

    async def via_gateway():
        started = time.perf_counter()
        ttft, _ = await pool.stream("/v1/completions", body, started)
        return ttft

    async def direct():
        request = GenerateRequest(request_id=f"direct-{rate}-{next(counter)}", inputs=[GenerateInput(text=PROMPT)],
                                  params=SamplingParams(max_tokens=8))
        started = time.perf_counter()
        async for chunk in worker.generate(request):
            if chunk.token_ids:
                return time.perf_counter() - started
        return None

    d_ttft, d_err, d_rate = await open_loop(rate, duration, direct)
    cpu_before = cpu_seconds(gateway_pid)
    g_ttft, g_err, g_rate = await open_loop(rate, duration, via_gateway)
    gateway_cpu_us = (cpu_seconds(gateway_pid) - cpu_before) / max(1, len(g_ttft) + g_err) * 1e6
    pct = lambda xs, q: percentile(xs, q) * 1000  # noqa: E731
    return {
        "rate": rate, "achieved_rate": min(d_rate, g_rate), "errors": d_err + g_err, "requests": len(g_ttft),
        "direct_p50_ms": pct(d_ttft, 50), "direct_p99_ms": pct(d_ttft, 99),
        "gateway_p50_ms": pct(g_ttft, 50), "gateway_p99_ms": pct(g_ttft, 99),
        "added_p50_ms": pct(g_ttft, 50) - pct(d_ttft, 50), "added_p99_ms": pct(g_ttft, 99) - pct(d_ttft, 99),
        "gateway_cpu_us_per_request": gateway_cpu_us, "load_average": os.getloadavg()[0],
    }


async def throughput(port: int, streams: int, max_tokens: int, gateway_pid: int) -> tuple[float, int, float]:
    """(tokens/s, tokens, gateway CPU seconds) of `streams` concurrent streams of `max_tokens`."""
    pool = HttpPool(port)
    body = completion_body(max_tokens)
    cpu_before = cpu_seconds(gateway_pid)
    started = time.perf_counter()
    results = await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter()) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(gateway_pid) - cpu_before
    pool.close()
    tokens = sum(t for _, t in results)
    return tokens / elapsed, tokens, cpu


async def main(args: argparse.Namespace) -> dict:
    duration = 4.0 if args.quick else 10.0
    results: dict = {}
    worker = mock_worker(5, 2000)
    async with worker, gateway_for(worker) as gateway, WorkerClient(worker.address) as client:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        await latency_figures(args, duration, gateway, client, results)
    # Throughput: a fast worker, long outputs, worker-side coalescing every 20 ms.
    worker = mock_worker(1, 20000, "--mock-max-model-len", "65536")
    async with worker, gateway_for(worker, "--stream-interval-ms", "20") as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        await throughput(gateway.port, 4, 2000, gateway.pid)  # warm-up
        tps, tokens, cpu = await throughput(gateway.port, 64, 8000 if args.quick else 20000, gateway.pid)
    results["tokens_per_s"] = tps
    results["tokens"] = tokens
    results["tokens_per_gateway_cpu_s"] = tokens / max(cpu, 1e-9)
    print(json.dumps({"tokens_per_s": round(tps), "tokens": tokens, "gateway_cpu_s": cpu}), flush=True)
    return results


async def latency_figures(args: argparse.Namespace, duration: float, gateway: GatewayProcess, client: WorkerClient,
                          results: dict) -> None:
    """Added TTFT at 200 req/s, then the rate sweep up to P99 added TTFT > 10 ms."""
    pool = HttpPool(gateway.port)
    await ttft_pair(50, 1.0, pool, client, gateway.pid)  # warm-up: connections, caches
    results["at_200"] = await ttft_pair(200, duration, pool, client, gateway.pid)
    print(json.dumps(results["at_200"]), flush=True)
    sweep = []
    for rate in ([400, 800, 1200] if args.quick else [300, 400, 500, 600, 800, 1000, 1200, 1500]):
        point = await ttft_pair(rate, duration / 2, pool, client, gateway.pid)
        print(json.dumps(point), flush=True)
        if ERRORS:
            print("errors:", ERRORS, flush=True)
        sweep.append(point)
        if point["added_p99_ms"] > 10 or point["errors"] or point["achieved_rate"] < 0.95 * rate:
            break
    results["sweep"] = sweep
    ok = [p["rate"] for p in [results["at_200"], *sweep]
          if p["added_p99_ms"] <= 10 and not p["errors"] and p["achieved_rate"] >= 0.95 * p["rate"]]
    results["max_rate_p99_added_le_10ms"] = max(ok) if ok else None
    pool.close()


def report(results: dict) -> str:
    at = results["at_200"]
    lines = [
        f"added TTFT at 200 req/s: P50 {at['added_p50_ms']:+.2f} ms, P99 {at['added_p99_ms']:+.2f} ms "
        f"(direct P50/P99 {at['direct_p50_ms']:.2f}/{at['direct_p99_ms']:.2f} ms, gateway "
        f"{at['gateway_p50_ms']:.2f}/{at['gateway_p99_ms']:.2f} ms, {at['requests']} requests)",
        f"gateway CPU per request at 200 req/s: {at['gateway_cpu_us_per_request']:.0f} us (all its threads); "
        f"1-min load average during the run: {at['load_average']:.1f} on 2 cores",
        f"highest rate with P99 added <= 10 ms: {results['max_rate_p99_added_le_10ms']} req/s",
        f"streamed tokens/s through one gateway: {results['tokens_per_s']:,.0f} ({results['tokens']:,} tokens; "
        f"{results['tokens_per_gateway_cpu_s']:,.0f} tokens per gateway CPU-second)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Shorter runs (a smoke test of the script)")
    parser.add_argument("--json", help="Also write the raw figures to this file")
    options = parser.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        figures = runner.run(main(options))
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    print(report(figures))
