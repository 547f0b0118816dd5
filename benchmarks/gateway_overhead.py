"""What the gateway adds: TTFT overhead vs the worker directly, top sustainable rate, streamed tokens/s.

    python benchmarks/gateway_overhead.py [--quick]

    python benchmarks/gateway_overhead.py [--quick] [--processes N] [--src OTHER/src] [--json FILE]

One run, on mock workers (the named stand-in engine: fixed TTFT, set token pace), the figures of
issue #17's target 3, and a table of them against the targets:

1. Added TTFT at 200 and at 1,000 req/s (open loop, Poisson): P50/P99 of time-to-first-token
   through the gateway minus the same percentile straight to the worker over gRPC, same rate.
2. The highest rate the gateway sustains with P99 added TTFT <= 10 ms (a rate sweep, each rate
   compared with a direct run at that rate).
3. Streamed tokens/s through the gateway, twice: at ONE TOKEN PER SSE EVENT (mock worker at 100
   tokens/s per sequence, i.e. one token per ~10 ms engine step, gateway --stream-interval-ms 0,
   many concurrent streams), and coalesced (fast mock worker, --stream-interval-ms 20: about 400
   tokens per event). Counted from each stream's final usage; events counted at the client.
   With the worker and this load generator on the same cores, tokens/s is capped by the machine;
   tokens per gateway CPU-second is what one gateway core would carry.

Each latency point also says how often the gateway's garbage collector paused it for 1 ms or
more while it was measured, and for how long at most (benchmarks/probes/gc_probe/ logs the pauses).

`--src` runs another checkout's src/ (PYTHONPATH of the worker and gateway) for before/after
runs; `--processes N` passes `--processes N` to the gateway (CPU counted over all its processes).

The load generator (this process: a lean HTTP/1.1 keep-alive client, so that client cost does
not pose as gateway cost; gRPC via our WorkerClient for the direct runs) is a separate process
from the gateway and the worker. On a 2-core machine all three share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "probes"))  # gc_pauses: the GC-pause probe
from gc_pauses import pauses_between, probe_env, remove_log, watch_own_collector  # noqa: E402
from proc_stat import cpu_seconds  # noqa: E402

from vllm_fleet.bench import ArrivalProcess, percentile
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.processes import GatewayProcess
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput

MODEL = "mock-bench"
PROMPT = "tell me about the river and the mountain"
ERRORS: dict[str, int] = {}
QUIET = {"VLLM_FLEET_LOG_LEVEL": "WARNING"}  # the worker's and gateway's own logging is not what we measure


SETUP = {"src": None, "worker_src": None, "processes": 1}  # from the command line


def _env(src: str | None = None) -> dict[str, str]:
    src = src or SETUP["src"]
    return {**QUIET, **({"PYTHONPATH": src} if src else {})}


def mock_worker(ttft_ms: int, tokens_per_s: int, *extra: str) -> WorkerProcess:
    return WorkerProcess(["--engine", "mock", "--served-model-name", MODEL, "--mock-ttft-ms", str(ttft_ms),
                          "--mock-tokens-per-s", str(tokens_per_s), *extra], _env(SETUP["worker_src"]),
                         stop_grace_s=15)


def gateway_for(worker: WorkerProcess, *extra: str) -> GatewayProcess:
    return gateway_for_all([worker], *extra)


def gateway_for_all(workers: list[WorkerProcess], *extra: str) -> GatewayProcess:
    processes = ["--processes", str(SETUP["processes"])] if SETUP["processes"] != 1 else []
    return GatewayProcess(["--workers", ",".join(w.address for w in workers), "--no-access-log", *processes, *extra],
                          probe_env(_env()), stop_grace_s=15)


class HttpConnection:
    """A minimal HTTP/1.1 keep-alive client: just enough for SSE from our gateway."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.answered = False  # whether the current request got a status line
        self.events = 0  # SSE data events received over this connection
        self.last_text_at: float | None = None  # perf_counter of the current request's last text event

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
        self.last_text_at = None
        while True:  # chunked transfer encoding
            size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return ttft, tokens
            self.events += data.count(b"data: {")
            if b'"text":"' in data and b'"text":""' not in data:
                self.last_text_at = time.perf_counter()
                ttft = self.last_text_at - started if ttft is None else ttft
            pending += data[:-2]
            if b'"usage":{' in pending:
                # Not the object's first "}": usage may nest prompt_tokens_details (a prefix cache's hits).
                found = _COMPLETION_TOKENS.search(pending, pending.index(b'"usage":{'))
                tokens = int(found.group(1)) if found else tokens
            if b"data: [DONE]" in pending:
                pending = b""
            elif len(pending) > 4096:
                pending = pending[-4096:]


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


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
        request = build_request(request_id=f"direct-{rate}-{next(counter)}", inputs=[GenerateInput(text=PROMPT)],
                                params=SamplingParams(max_tokens=8))
        started = time.perf_counter()
        async for chunk in worker.generate(request):
            if chunk.token_ids:
                return time.perf_counter() - started
        return None

    d_ttft, d_err, d_rate = await open_loop(rate, duration, direct)
    cpu_before, since = cpu_seconds(gateway_pid), time.time()
    g_ttft, g_err, g_rate = await open_loop(rate, duration, via_gateway)
    gateway_cpu_us = (cpu_seconds(gateway_pid) - cpu_before) / max(1, len(g_ttft) + g_err) * 1e6
    pauses = pauses_between(since, time.time())
    pct = lambda xs, q: percentile(xs, q) * 1000  # noqa: E731
    return {
        "rate": rate, "achieved_rate": min(d_rate, g_rate), "errors": d_err + g_err, "requests": len(g_ttft),
        "direct_p50_ms": pct(d_ttft, 50), "direct_p99_ms": pct(d_ttft, 99),
        "gateway_p50_ms": pct(g_ttft, 50), "gateway_p99_ms": pct(g_ttft, 99),
        "added_p50_ms": pct(g_ttft, 50) - pct(d_ttft, 50), "added_p99_ms": pct(g_ttft, 99) - pct(d_ttft, 99),
        "gateway_cpu_us_per_request": gateway_cpu_us, "load_average": os.getloadavg()[0], **pauses,
    }


async def throughput(port: int, streams: int, max_tokens: int, gateway_pid: int) -> dict:
    """Tokens/s, tokens, SSE events and gateway CPU seconds of `streams` concurrent streams of `max_tokens`."""
    pool = HttpPool(port)
    body = completion_body(max_tokens)
    # Open the connections first: a connection's first request is not what we measure.
    await asyncio.gather(*(pool.stream("/v1/completions", completion_body(2), time.perf_counter())
                           for _ in range(streams)))
    events_before = sum(c.events for c in pool.idle)
    cpu_before = cpu_seconds(gateway_pid)
    started = time.perf_counter()
    results = await asyncio.gather(*(pool.stream("/v1/completions", body, time.perf_counter()) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(gateway_pid) - cpu_before
    events = sum(c.events for c in pool.idle) - events_before
    pool.close()
    tokens = sum(t for _, t in results)
    return {"streams": streams, "tokens_per_s": tokens / elapsed, "tokens": tokens, "events": events,
            "tokens_per_event": tokens / max(events, 1), "seconds": elapsed, "gateway_cpu_s": cpu,
            "gateway_cpu_us_per_event": cpu / max(events, 1) * 1e6, "tokens_per_gateway_cpu_s": tokens / max(cpu, 1e-9)}


async def main(args: argparse.Namespace) -> dict:
    duration = 4.0 if args.quick else 10.0
    results: dict = {"processes": SETUP["processes"], "src": SETUP["src"] or "this checkout"}
    watch_own_collector()
    worker = mock_worker(5, 2000)
    async with worker, gateway_for(worker) as gateway, WorkerClient(worker.address) as client:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        await latency_figures(args, duration, gateway, client, results)
    # One token per SSE event: 100 tokens/s per sequence is one token per mock engine step.
    worker = mock_worker(1, 100, "--mock-max-model-len", "65536")
    async with worker, gateway_for(worker, "--stream-interval-ms", "0") as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        results["per_token"] = await throughput(gateway.port, args.streams, int(100 * duration), gateway.pid)
    print(json.dumps({"one_token_per_event": results["per_token"]}), flush=True)
    # Coalesced: a fast worker, long outputs, worker-side coalescing every 20 ms.
    worker = mock_worker(1, 20000, "--mock-max-model-len", "65536")
    async with worker, gateway_for(worker, "--stream-interval-ms", "20") as gateway:
        await worker.wait_serving(60)
        await gateway.wait_ready(60)
        await throughput(gateway.port, 4, 2000, gateway.pid)  # warm-up
        results["coalesced"] = await throughput(gateway.port, 64, 8000 if args.quick else 20000, gateway.pid)
    print(json.dumps({"coalesced": results["coalesced"]}), flush=True)
    results["load_average_end"] = os.getloadavg()[0]
    return results


def _passes(point: dict) -> bool:
    return point["added_p99_ms"] <= 10 and not point["errors"] and point["achieved_rate"] >= 0.95 * point["rate"]


async def latency_figures(args: argparse.Namespace, duration: float, gateway: GatewayProcess, client: WorkerClient,
                          results: dict) -> None:
    """Added TTFT at 200 and 1,000 req/s, then the rate sweep up to P99 added TTFT > 10 ms."""
    pool = HttpPool(gateway.port)
    await ttft_pair(50, 1.0, pool, client, gateway.pid)  # warm-up: connections, caches
    for rate in (200, 1000):
        results[f"at_{rate}"] = await ttft_pair(rate, duration if rate == 200 else duration / 2, pool, client,
                                                gateway.pid)
        print(json.dumps(results[f"at_{rate}"]), flush=True)
    sweep = []
    for rate in ([600, 1500] if args.quick else [400, 600, 800, 1200, 1500]):
        point = await ttft_pair(rate, duration / 2, pool, client, gateway.pid)
        print(json.dumps(point), flush=True)
        if ERRORS:
            print("errors:", ERRORS, flush=True)
        sweep.append(point)
        if not _passes(point):
            break
    results["sweep"] = sweep
    ok = [p["rate"] for p in [results["at_200"], results["at_1000"], *sweep] if _passes(p)]
    results["max_rate_p99_added_le_10ms"] = max(ok) if ok else None
    pool.close()


def run_on_uvloop(coroutine):
    """Run `coroutine` on uvloop (the gateway's own loop) where installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def report(results: dict) -> str:
    lines = [f"gateway: {results['processes']} process(es), {results['src']}"]
    for rate in (200, 1000):
        at = results[f"at_{rate}"]
        lines.append(
            f"added TTFT at {rate} req/s (achieved {at['achieved_rate']:.0f}, errors {at['errors']}): "
            f"P50 {at['added_p50_ms']:+.2f} ms, P99 {at['added_p99_ms']:+.2f} ms (direct P50/P99 "
            f"{at['direct_p50_ms']:.2f}/{at['direct_p99_ms']:.2f} ms, gateway {at['gateway_p50_ms']:.2f}/"
            f"{at['gateway_p99_ms']:.2f} ms); gateway CPU {at['gateway_cpu_us_per_request']:.0f} us per request; "
            f"gateway GC pauses >= 1 ms: {at['gc_pauses']} (longest {at['gc_pause_max_ms']:.1f} ms, "
            f"{at['gc_full_collections']} full), load generator's: {at['client_gc_pauses']} "
            f"(longest {at['client_gc_pause_max_ms']:.1f} ms); load average {at['load_average']:.1f} "
            f"on {os.cpu_count()} cores")
    lines.append(f"highest rate with P99 added <= 10 ms: {results['max_rate_p99_added_le_10ms']} req/s")
    for name, label in (("per_token", "ONE token per SSE event"), ("coalesced", "coalesced 20 ms")):
        t = results[name]
        lines.append(f"streamed tokens/s, {label}: {t['tokens_per_s']:,.0f} ({t['tokens']:,} tokens in {t['events']:,} "
                     f"events, {t['tokens_per_event']:.1f} tokens/event, {t['streams']} streams); gateway CPU "
                     f"{t['gateway_cpu_us_per_event']:.1f} us/event = {t['tokens_per_gateway_cpu_s']:,.0f} tokens "
                     f"per gateway CPU-second")
    return "\n".join(lines + [""] + target_table(results))


def target_table(results: dict) -> list[str]:
    """Issue #17 target 3, met or not, from these figures."""
    a200, a1000 = results["at_200"], results["at_1000"]
    one, many = results["per_token"], results["coalesced"]
    rows = [
        ("added TTFT P99 at 200 req/s <= 2 ms", f"{a200['added_p99_ms']:+.2f} ms", a200["added_p99_ms"] <= 2),
        ("added TTFT P99 at 1,000 req/s <= 10 ms", f"{a1000['added_p99_ms']:+.2f} ms (achieved "
         f"{a1000['achieved_rate']:.0f} req/s, {a1000['errors']} errors)", _passes(a1000)),
        (">= 1,000 req/s sustained (P99 added <= 10 ms, no errors)", f"{results['max_rate_p99_added_le_10ms']} req/s",
         (results["max_rate_p99_added_le_10ms"] or 0) >= 1000),
        (">= 100,000 tokens/s, ONE token per SSE event", f"{one['tokens_per_s']:,.0f} tokens/s measured; "
         f"{one['tokens_per_gateway_cpu_s']:,.0f} per gateway CPU-s", one["tokens_per_s"] >= 100_000),
        (">= 100,000 tokens/s, coalesced (20 ms)", f"{many['tokens_per_s']:,.0f} tokens/s measured; "
         f"{many['tokens_per_gateway_cpu_s']:,.0f} per gateway CPU-s", many["tokens_per_s"] >= 100_000),
    ]
    lines = ["| target (issue #17, 3) | measured | met |", "|---|---|---|"]
    lines += [f"| {target} | {value} | {'yes' if met else 'NO'} |" for target, value, met in rows]
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Shorter runs (a smoke test of the script)")
    parser.add_argument("--json", help="Also write the raw figures to this file")
    parser.add_argument("--src", help="Run this checkout's src/ in the worker and gateway (before/after runs)")
    parser.add_argument("--worker-src", help="Run the mock worker from this src/ (default: as --src), so that "
                        "before/after runs differ in the gateway only")
    parser.add_argument("--processes", type=int, default=1, help="Gateway processes (gateway --processes N)")
    parser.add_argument("--streams", type=int, default=200, help="Concurrent streams at one token per event")
    options = parser.parse_args()
    SETUP.update(src=options.src, worker_src=options.worker_src, processes=options.processes)
    try:
        figures = run_on_uvloop(main(options))
    finally:
        remove_log()
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    print(report(figures))
