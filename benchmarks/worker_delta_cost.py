"""Worker CPU per streamed delta at GPU-like fan-out, on the mock engine.

On an H200 the engine steps ~20 times a second for ~500 sequences: ~10,000 deltas/s go through
the worker process, which shares one interpreter with vLLM's output processing (RESULTS.md,
"GPU (H200)"). This measures what our side of that costs: N streams of M tokens from a mock
worker at a set per-stream rate, the worker's CPU time (user + system, from /proc) divided by
the deltas it streamed. The mock's own token loop is included, so the figure is an upper bound
on our overhead; compare versions by running them in one invocation (--src A --src B), rounds
alternating.

    python benchmarks/worker_delta_cost.py --streams 256 --tokens 200 --tokens-per-s 40 \\
        --src src --src /tmp/old-checkout/src --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import time
from pathlib import Path

from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.processes import exit_on_sigterm
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_round(address: str, streams: int, tokens: int, tag: str, multiplex: bool) -> tuple[int, float]:
    client = WorkerClient(address, ClientOptions(multiplex=multiplex))
    await client.wait_serving(timeout=60)  # connected before the clock starts
    chunks = 0

    async def stream(i: int) -> None:
        nonlocal chunks
        request = build_request(f"{tag}-{i}", [GenerateInput(token_ids=[5, 6, 7, i % 30 + 1])],
                                SamplingParams(max_tokens=tokens, ignore_eos=True))
        async for chunk in client.generate(request, timeout=600):
            chunks += 1 if chunk.token_ids else 0

    started = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    elapsed = time.perf_counter() - started
    await client.close()
    return chunks, elapsed


def worker_for(src: str, tokens_per_s: float) -> WorkerProcess:
    """A mock worker running the code under `src` (its PYTHONPATH, not this script's imports)."""
    return WorkerProcess(["--engine", "mock", "--mock-tokens-per-s", str(tokens_per_s), "--mock-ttft-ms", "1"],
                         {"PYTHONPATH": src})


async def main(args: argparse.Namespace) -> None:
    results: dict[str, list[tuple[float, float]]] = {src: [] for src in args.src}
    async with contextlib.AsyncExitStack() as stack:
        workers = [(src, await stack.enter_async_context(worker_for(src, args.tokens_per_s))) for src in args.src]
        for _, worker in workers:
            await worker.wait_serving(60)
        for r in range(args.rounds):
            order = workers if r % 2 == 0 else workers[::-1]
            for src, worker in order:
                before, client_before = cpu_seconds(worker.pid), own_cpu_seconds()
                chunks, elapsed = await one_round(worker.address, args.streams, args.tokens, f"r{r}", args.multiplex)
                used, client_used = cpu_seconds(worker.pid) - before, own_cpu_seconds() - client_before
                results[src].append((used / chunks * 1e6, chunks / elapsed, client_used / chunks * 1e6))
                print(f"round {r} {src}: {chunks} deltas in {elapsed:.1f} s ({chunks / elapsed:,.0f}/s), "
                      f"worker CPU {used:.2f} s = {used / chunks * 1e6:.1f} µs/delta, "
                      f"client {client_used / chunks * 1e6:.1f} µs/delta  (load {os.getloadavg()[0]:.1f})", flush=True)
    print("\n| worker code | worker CPU µs per delta (median) | client CPU µs per delta | deltas/s (median) |\n|---|---|---|---|")
    for src, rows in results.items():
        print(f"| {src} | {statistics.median(r[0] for r in rows):.1f} | {statistics.median(r[2] for r in rows):.1f} "
              f"| {statistics.median(r[1] for r in rows):,.0f} |")
    if len(args.src) == 2:
        a, b = (statistics.median(r[0] for r in results[s]) for s in args.src)
        print(f"\nCPU per delta, {args.src[0]} / {args.src[1]}: {a / b:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--tokens-per-s", type=float, default=40.0, help="per stream (the mock sends one delta per token at this rate)")
    parser.add_argument("--src", action="append", help="PYTHONPATH of the worker's code (repeat to compare); default src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-multiplex", dest="multiplex", action="store_false",
                        help="one Generate call per request instead of one GenerateMany call for all")
    args = parser.parse_args()
    args.src = args.src or [str(Path(__file__).resolve().parents[1] / "src")]
    exit_on_sigterm()
    asyncio.run(main(args))
