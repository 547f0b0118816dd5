"""Spark driver vs the async client on the same workers; the micro-batch window's latency cost.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/spark_throughput.py --engine vllm [--rows 1000 --max-tokens 16]
    python benchmarks/spark_throughput.py --engine mock            # control-plane overhead only
    python benchmarks/spark_throughput.py --workers h:p,h:p        # workers already running

Starts two workers (real vLLM on cores 0 and 1, or mock), then measures, in one run:

1. Throughput: the same rows (distinct prompts, greedy, fixed max_tokens) answered
   a) by the async client directly: one Router in this process, `concurrency` requests at once;
   b) by Spark local[2]: generate() + collect, 2 partitions x max_in_flight rows in flight
      (the same total concurrency), send_as=per_row and send_as=one_request.
   Spark is warmed up first (its Python workers and their Routers exist), so the figure is the
   steady cost of a job, not JVM start. Figures: rows/s, output tokens/s, and Spark / client.
2. Latency at a low arrival rate: rows arrive one by one (Poisson, --rate rows/s) into the
   executor-side pipeline (MicroBatcher + Answerer + Router, what each Spark task runs) with
   batch_wait_ms = 0 and = --window-ms; per-row P50/P95 from arrival to answer. Spark itself
   hands rows over in Arrow batches, all at once, so the window is measured at the component.

On a 2-core machine Spark's JVM and its Python workers compete with the engines for the same
cores: the ratio includes that cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time

from vllm_fleet.bench import percentile
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.processes import exit_on_sigterm
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router

TOPICS = ("rivers", "mountains", "cities", "bread", "music", "trains", "winter", "cats", "chess", "tea")


def bench_worker(engine: str, cores: str, dtype: str = "auto") -> WorkerProcess:
    """A small real vLLM worker bound to `cores`, or a mock one."""
    if engine == "vllm":
        args, bind = [*small_vllm_args(), "--dtype", dtype], cores
    else:
        args, bind = ["--engine", "mock", "--mock-tokens-per-s", "500", "--mock-ttft-ms", "10"], None
    return WorkerProcess(args, {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, cores=bind,
                         log_path=f"/tmp/spark-bench-worker-{cores}.log")


def prompts(count: int, salt: str) -> list[str]:
    return [f"[{salt}{i}] Write one short sentence about {TOPICS[i % len(TOPICS)]}." for i in range(count)]


async def client_run(addresses: list[str], texts: list[str], params: dict, concurrency: int) -> tuple[float, int]:
    """(seconds, output tokens) for `texts` through one in-process Router, `concurrency` at once."""
    router = Router(StaticRegistry.from_spec(addresses))
    await router.start()
    await router.wait_ready(60)
    slots = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(index: int, text: str) -> None:
        nonlocal tokens
        async with slots:
            request = build_request(request_id=f"bench-{index}", inputs=[GenerateInput(text=text)],
                                    params=SamplingParams(**params))
            async for chunk in router.stream(request):
                tokens += len(chunk.token_ids)

    started = time.perf_counter()
    await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
    elapsed = time.perf_counter() - started
    await router.close()
    return elapsed, tokens


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "2g")
               .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def spark_run(session, addresses: list[str], texts: list[str], params: dict, **options) -> tuple[float, int, int]:
    """(seconds, output tokens, error rows) for one generate() job over a cached DataFrame."""
    from vllm_fleet.spark import generate

    df = session.createDataFrame(list(enumerate(texts)), "id long, prompt string").repartition(2).cache()
    df.count()
    out = generate(df, prompt_col="prompt", params=params, workers=addresses, **options)
    started = time.perf_counter()
    rows = out.select("completion_tokens", "error").collect()
    elapsed = time.perf_counter() - started
    df.unpersist()
    return elapsed, sum(r.completion_tokens or 0 for r in rows), sum(1 for r in rows if r.error)


async def window_latency(addresses: list[str], params: dict, *, rate: float, rows: int, window_ms: float,
                         seed: int) -> list[float]:
    """Per-row seconds from arrival to answer through the executor pipeline at `rate` rows/s."""
    from vllm_fleet.spark.answerer import Answerer
    from vllm_fleet.spark.config import build_config
    from vllm_fleet.spark.partition import PartitionRun

    config = build_config(prompt_col="prompt", workers=addresses, params=params, batch_wait_ms=window_ms)
    router = Router(StaticRegistry.from_spec(addresses), config.router_config())
    await router.start()
    await router.wait_ready(60)
    run = PartitionRun(Answerer(router, config), config, task_key=f"latency-{window_ms}")
    rng = random.Random(seed)
    tasks = []
    for text in prompts(rows, f"w{window_ms}-"):
        started = time.perf_counter()
        future = await run.batcher.submit(GenerateInput(text=text), "lat-" + text[:16])
        tasks.append(asyncio.ensure_future(_timed(future, started)))
        await asyncio.sleep(rng.expovariate(rate))
    latencies = list(await asyncio.gather(*tasks))
    await run.close()
    await router.close()
    return latencies


async def _timed(future: asyncio.Future, started: float) -> float:
    result = await future
    if result.error:
        raise RuntimeError(result.error)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["vllm", "mock"], default="vllm")
    parser.add_argument("--workers", default=None, help="Use running workers host:port,host:port instead")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-in-flight", type=int, default=32, help="Per Spark task (2 tasks run at once)")
    parser.add_argument("--rate", type=float, default=2.0, help="Arrival rate of the latency test, rows/s")
    parser.add_argument("--latency-rows", type=int, default=40)
    parser.add_argument("--window-ms", type=float, default=50.0)
    parser.add_argument("--json", default=None, help="Also write the figures to this file")
    parser.add_argument("--dtype", default="auto",
                        help="vLLM weight dtype; on a CPU without native bf16 (AVX2 only) float32 is several times faster")
    args = parser.parse_args()

    if args.workers:
        return measure(args, args.workers.split(","))
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(bench_worker(args.engine, cores, args.dtype)) for cores in ("0", "1")]
        for worker in workers:
            asyncio.run(worker.wait_serving(300))
        return measure(args, [worker.address for worker in workers])


def measure(args: argparse.Namespace, addresses: list[str]) -> int:
    params = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    concurrency = 2 * args.max_in_flight
    figures: dict[str, object] = {"rows": args.rows, "max_tokens": args.max_tokens, "concurrency": concurrency,
                                  "engine": args.engine if not args.workers else "given"}
    session = spark_session()
    spark_run(session, addresses, prompts(64, "warm-"), params, max_in_flight=args.max_in_flight)  # warm up
    asyncio.run(client_run(addresses, prompts(64, "warmc-"), params, concurrency))

    seconds, tokens = asyncio.run(client_run(addresses, prompts(args.rows, "c-"), params, concurrency))
    figures["client"] = {"s": seconds, "rows_per_s": args.rows / seconds, "tokens_per_s": tokens / seconds}
    print("client:", json.dumps(figures["client"]), flush=True)  # each figure as it comes: long runs
    for send_as in ("per_row", "one_request"):
        seconds, tokens, errors = spark_run(session, addresses, prompts(args.rows, f"s-{send_as}-"), params,
                                            max_in_flight=args.max_in_flight, send_as=send_as)
        figures[f"spark_{send_as}"] = {"s": seconds, "rows_per_s": args.rows / seconds,
                                       "tokens_per_s": tokens / seconds, "error_rows": errors}
        print(f"spark {send_as}:", json.dumps(figures[f"spark_{send_as}"]), flush=True)
    session.stop()
    client = figures["client"]
    for send_as in ("per_row", "one_request"):
        spark = figures[f"spark_{send_as}"]
        spark["ratio_rows"] = spark["rows_per_s"] / client["rows_per_s"]
        spark["ratio_tokens"] = spark["tokens_per_s"] / client["tokens_per_s"]

    for window in (0.0, args.window_ms):
        latencies = asyncio.run(window_latency(addresses, params, rate=args.rate, rows=args.latency_rows,
                                               window_ms=window, seed=1))
        figures[f"latency_window_{window:g}ms"] = {"p50_ms": percentile(latencies, 50) * 1000,
                                                   "p95_ms": percentile(latencies, 95) * 1000}
    print(json.dumps(figures, indent=2))
    print(f"\nclient: {client['rows_per_s']:.1f} rows/s, {client['tokens_per_s']:.1f} tok/s")
    for send_as in ("per_row", "one_request"):
        spark = figures[f"spark_{send_as}"]
        print(f"spark {send_as}: {spark['rows_per_s']:.1f} rows/s, {spark['tokens_per_s']:.1f} tok/s, "
              f"ratio {spark['ratio_tokens']:.3f}, error rows {spark['error_rows']}")
    for window in (0.0, args.window_ms):
        lat = figures[f"latency_window_{window:g}ms"]
        print(f"batch_wait_ms={window:g} at {args.rate:g} rows/s: P50 {lat['p50_ms']:.0f} ms, P95 {lat['p95_ms']:.0f} ms")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
