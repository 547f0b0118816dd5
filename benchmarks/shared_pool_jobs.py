"""Online chat through the gateway beside a real Spark job and an OpenAI Batch API job, on the
same two workers: the user-facing half of issue #29 (`shared_pool.py` measures the router's
controller in-process; this one runs the paths a user runs).

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/shared_pool_jobs.py --workers vllm
    python benchmarks/shared_pool_jobs.py --workers mock --rows 200          # rehearse the sequence

On a GPU host add shared_pool.py's worker options (`--model`, `--cuda-devices 0,0`,
`--worker-arg ...`, `--python`, `--env`); Spark needs Java (JAVA_HOME) and pyspark.

One worker pair, one `vllm-fleet gateway` in front of it (least outstanding, the Batch API on, the
controller's targets from `--gateway-arg`), and these phases, each with its own texts so none hits
another's prefix cache:

1. online alone: streamed chat requests through the gateway, Poisson `--rate` per second, for
   `--seconds`.
2. Spark alone: `vllm_fleet.spark.generate` over `--rows` rows (local[`--spark-cores`], straight to
   the workers over gRPC, class batch); its output tokens/s is the Spark job's capacity C.
3. online + Spark, classes: phase 1's arrivals for as long as a phase-2-sized job runs.
4. Batch API alone: the same rows as a JSONL file, `/v1/files` + `/v1/batches` on the gateway
   (the batch class), polled to completion; its capacity C'.
5. online + Batch API: phase 1's arrivals while a phase-4-sized batch runs.
6. online + Spark, no classes: phase 3 with the job's rows sent as interactive. Last, because
   those rows are interactive work: relative targets would learn them as the workers' latency
   without batch, and the phases after it would be judged against that.

`--phases` picks which run after phase 1 (a device call is limited to ten minutes): `spark`
(phases 2-3), `api` (4-5), `no-classes` (6), and `spark-steps`: phase 3 again with the rows'
tokens sent per engine step (`stream_interval_ms` 0, as before it was 250 ms), which shows what
coalescing a batch row's chunks does to the chat streams' ITL.

`--api-variant NAME='GATEWAY ARGS'` (repeatable, with `api`) runs phase 5 again through a second
gateway started with those extra arguments, before phase 5 itself (phase 4's rate is its C too):
an option A/B'd in one run on the same workers. The variant goes first, so if a phase run later
does better for being later (a CPU run showed that once), the default gets that advantage.
`--spark-variant NAME='JSON'` (repeatable, with `spark`) does the same for phase 3: the job's
routers get those service-class settings on top of the targets, e.g. '{"pause_batch_on_cut": true}'.
Each Batch API phase also reports its gateway's controller counters over the phase (cuts of a
worker's batch cap, withdrawals, pauses; the router's /metrics).

Figures: online TTFT P50/P99 and ITL P99 (gaps between a stream's content chunks) per phase and
as ratios to phase 1; each job's rows/s, output tokens/s and share of what the idle capacity
allows, C x (1 - U), U = online output tokens/s in phase 1 / C (as shared_pool.py computes it).
Every job must answer every row with exactly `--max-tokens` tokens (checked: same work).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import tempfile
import time

import httpx

from vllm_fleet.bench import percentile
from shared_pool import WORDS, add_worker_options, worker_process
from worker_pair import worker_pair
from vllm_fleet.processes import GatewayProcess
from gateway_counters import counted
from local_spark import spark_session


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Online:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.output_tokens = 0
        self.errors: list[str] = []


async def chat(http: httpx.AsyncClient, model: str, text: str, args, stats: Online) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": args.online_max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    last = None
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                stats.errors.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    stats.output_tokens += chunk["usage"]["completion_tokens"]
                if not any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", [])):
                    continue
                now = time.perf_counter()
                if last is None:
                    stats.ttft.append(now - started)
                else:
                    stats.itl.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        stats.errors.append(type(exc).__name__)


async def online_traffic(http: httpx.AsyncClient, model: str, args, salt: str, until) -> Online:
    """Poisson arrivals at --rate until `until()` is true (and at least one request)."""
    stats, rng, arrivals = Online(), random.Random(f"online-{salt}"), random.Random(args.seed)
    tasks = []
    while not tasks or not until():
        tasks.append(asyncio.create_task(chat(http, model, f"{salt} {words(rng, args.online_words)}", args, stats)))
        await asyncio.sleep(arrivals.expovariate(args.rate))
    await asyncio.gather(*tasks)
    return stats


def job_prompts(args, salt: str) -> list[str]:
    rng = random.Random(f"job-{salt}")
    return [f"{salt} row {i}: {words(rng, args.batch_words)}" for i in range(args.rows)]


def spark_job(session, addresses: list[str], args, salt: str, service_class: str, rows: int,
              stream_interval_ms: int = 250, classes: dict | None = None) -> dict:
    from vllm_fleet.spark import generate

    df = session.createDataFrame(list(enumerate(job_prompts(args, salt)[:rows])), "id long, prompt string") \
        .repartition(args.spark_cores).cache()
    df.count()
    started = time.perf_counter()
    rows = generate(df, prompt_col="prompt", id_col="id", workers=addresses, service_class=service_class,
                    params={"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True},
                    max_in_flight=args.spark_in_flight, stream_interval_ms=stream_interval_ms,
                    router={"classes": {**controller_targets(args), **(classes or {})}}).select("id", "error", "completion_tokens").collect()
    wall = time.perf_counter() - started
    df.unpersist()
    errors = [r.error for r in rows if r.error]
    return {"rows": len(rows), "distinct_ids": len({r.id for r in rows}), "row_errors": len(errors),
            "first_errors": errors[:3], "short": sum(1 for r in rows if not r.error and r.completion_tokens != args.max_tokens),
            "output_tokens": sum(r.completion_tokens or 0 for r in rows), "wall_s": wall}


async def batch_api_job(http: httpx.AsyncClient, model: str, args, salt: str) -> dict:
    lines = "".join(json.dumps({"custom_id": f"{salt}-{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": model, "prompt": prompt, "max_tokens": args.max_tokens,
                                         "temperature": 0, "ignore_eos": True}}) + "\n"
                    for i, prompt in enumerate(job_prompts(args, salt)))
    started = time.perf_counter()
    uploaded = (await http.post("/v1/files", files={"file": ("rows.jsonl", lines.encode())},
                                data={"purpose": "batch"})).raise_for_status().json()
    batch = (await http.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/completions",
                                                  "completion_window": "24h"})).raise_for_status().json()
    deadline = time.monotonic() + args.job_timeout_s
    while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch['id']} still {batch['status']} after {args.job_timeout_s:.0f} s")
        await asyncio.sleep(0.5)  # polling the API, as a client does; not a synchronisation
        batch = (await http.get(f"/v1/batches/{batch['id']}")).raise_for_status().json()
    wall = time.perf_counter() - started
    output = []
    if batch.get("output_file_id"):
        content = (await http.get(f"/v1/files/{batch['output_file_id']}/content")).raise_for_status().text
        output = [json.loads(line) for line in content.splitlines()]
    tokens = [line["response"]["body"]["usage"]["completion_tokens"] for line in output if line.get("response")]
    return {"status": batch["status"], "rows": len(output), "distinct_ids": len({line["custom_id"] for line in output}),
            "row_errors": batch["request_counts"]["failed"], "short": sum(1 for t in tokens if t != args.max_tokens),
            "output_tokens": sum(tokens), "wall_s": wall}


def controller_targets(args) -> dict:
    """The latency controller's targets, the same for the gateway and the Spark job's routers."""
    return {"interactive_targets": args.targets, "interactive_ttft_target_ms": args.ttft_target_ms,
            "interactive_itl_target_ms": args.itl_target_ms}


def gateway_target_args(args) -> list[str]:
    return ["--interactive-targets", args.targets, "--interactive-ttft-target-ms", str(args.ttft_target_ms),
            "--interactive-itl-target-ms", str(args.itl_target_ms)]


def online_summary(stats: Online, wall: float) -> dict:
    return {"online_requests": len(stats.ttft), "online_errors": len(stats.errors), "first_online_errors": stats.errors[:3],
            "ttft_p50_ms": percentile(stats.ttft, 50) * 1000, "ttft_p99_ms": percentile(stats.ttft, 99) * 1000,
            "itl_p99_ms": percentile(stats.itl, 99) * 1000, "online_output_tok_s": stats.output_tokens / wall}


async def warm_up(http: httpx.AsyncClient, model: str, args, salt: str) -> None:
    """Unmeasured online traffic through a fresh gateway: its and the engines' first requests are
    slow for reasons no job has a part in (H100 12-05: online alone's TTFT P99 was 501 ms at P50 62)."""
    start = time.perf_counter()
    await online_traffic(http, model, args, f"warm-{salt}", lambda: time.perf_counter() - start > args.warmup_s)


async def with_online(http, model: str, args, salt: str, job) -> dict:
    """Run `job` (a coroutine) with online traffic arriving for as long as it runs."""
    task = asyncio.create_task(job)
    started = time.perf_counter()
    stats = await online_traffic(http, model, args, salt, task.done)
    done = await task
    return {**online_summary(stats, time.perf_counter() - started), **{f"job_{k}": v for k, v in done.items()}}


async def run(args: argparse.Namespace) -> list[dict]:
    # Only phases with a Spark job start Spark: the Batch API phases then run where no JVM is staged.
    session = spark_session(args.spark_cores, args.spark_nice) if set(args.phases) & SPARK_PHASES else None
    async with worker_pair(lambda cores: worker_process(args.workers, cores, args),
                           cuda_devices=args.cuda_devices) as (addresses, info):
        print(f"workers: {args.workers} {addresses} model={info.model} max_num_seqs={info.settings.get('max_num_seqs')} "
              f"scheduling={info.settings.get('scheduling_policy', 'fcfs')}; "
              + (f"spark {session.version} local[{args.spark_cores}]" + (f" at nice {args.spark_nice}" if args.spark_nice else "")
                 if session else "no spark"), flush=True)
        with tempfile.TemporaryDirectory() as batch_dir:
            def gateway_process(name: str, extra: list[str]) -> GatewayProcess:
                return GatewayProcess(["--workers", ",".join(addresses), "--no-access-log",
                                       "--batch-dir", os.path.join(batch_dir, name),
                                       "--batch-concurrency", str(args.batch_api_concurrency),
                                       *gateway_target_args(args), *args.gateway_arg, *extra],
                                      {"VLLM_FLEET_LOG_LEVEL": "WARNING"},
                                      log_path=f"/tmp/shared-pool-jobs-gateway-{name}.log")

            gateway = gateway_process("main", [])
            async with gateway, httpx.AsyncClient(base_url=gateway.url, timeout=args.job_timeout_s) as http:
                await gateway.wait_ready(120)
                model = info.model
                results = []
                await warm_up(http, model, args, "main")

                def record(name: str, result: dict) -> None:
                    results.append({"phase": name, **result})
                    print(json.dumps(results[-1]), flush=True)

                start = time.perf_counter()
                stats = await online_traffic(http, model, args, "alone", lambda: time.perf_counter() - start > args.seconds)
                record("online alone", online_summary(stats, time.perf_counter() - start))
                spark = lambda salt, service_class, rows=args.rows, interval=250, classes=None: asyncio.to_thread(  # noqa: E731
                    spark_job, session, addresses, args, salt, service_class, rows, interval, classes)
                phases = set(args.phases)
                if phases & SPARK_PHASES:
                    # Warm-up: Spark's Python workers start and build their routers once; C is the steady rate.
                    await spark("warm-up", "batch", 4 * args.spark_cores)
                if "spark" in phases:
                    record("Spark alone", {f"job_{k}": v for k, v in (await spark("spark-alone", "batch")).items()})
                    for name, classes in args.spark_variant:
                        record(variant_phase("Spark", name), await with_online(
                            http, model, args, f"spark-{name}", spark(f"spark-{name}", "batch", classes=classes)))
                    record("online + Spark, classes",
                           await with_online(http, model, args, "spark-cls", spark("spark-cls", "batch")))
                if "spark-steps" in phases:
                    record("online + Spark, classes, per-step chunks",
                           await with_online(http, model, args, "spark-steps", spark("spark-steps", "batch", interval=0)))
                if "api" in phases:
                    record("Batch API alone",
                           {f"job_{k}": v for k, v in (await batch_api_job(http, model, args, "api-alone")).items()})
                    for name, extra in args.api_variant:
                        other = gateway_process(name, extra)
                        async with other, httpx.AsyncClient(base_url=other.url, timeout=args.job_timeout_s) as via:
                            await other.wait_ready(120)
                            await warm_up(via, model, args, name)
                            record(variant_phase("Batch API", name), await counted(via, with_online(
                                via, model, args, f"api-{name}", batch_api_job(via, model, args, f"api-{name}"))))
                    record("online + Batch API, classes", await counted(http, with_online(
                        http, model, args, "api-cls", batch_api_job(http, model, args, "api-cls"))))
                if "no-classes" in phases:
                    # Last: its rows are interactive work, and latency learnt without batch (relative
                    # targets) would learn them as what interactive latency is on these workers.
                    record("online + Spark, no classes",
                           await with_online(http, model, args, "spark-old", spark("spark-old", "interactive")))
    if session:
        session.stop()
    return results


SPARK_PHASES = {"spark", "spark-steps", "no-classes"}


def variant_phase(job: str, name: str) -> str:
    return f"online + {job}, classes, variant {name}"


def report(results: list[dict], args) -> None:
    by = {r["phase"]: r for r in results}
    alone = by["online alone"]
    print("\n| phase | online requests | TTFT P50 | TTFT P99 | ITL P99 | job rows/s | job output tok/s | job rows in/out/errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        job = f"{r['job_rows'] / r['job_wall_s']:.1f} | {r['job_output_tokens'] / r['job_wall_s']:.0f} | " \
              f"{args.rows}/{r['job_distinct_ids']}/{r['job_row_errors']}" if "job_rows" in r else "- | - | -"
        online = f"{r['online_requests']} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p99_ms']:.0f} ms | {r['itl_p99_ms']:.0f} ms" \
            if "ttft_p99_ms" in r else "- | - | - | -"
        print(f"| {r['phase']} | {online} | {job} |")
    print()
    mixed_phases = [r["phase"] for r in results if r["phase"].startswith("online + ")]
    for r in results:
        if "gateway_cuts" in r:
            breakdown = ", ".join(f"{key[len('gateway_cuts:'):]} {value:.0f}" for key, value in sorted(r.items())
                                  if key.startswith("gateway_cuts:") and value)
            print(f"{r['phase']}: the gateway's controller cut a worker's batch cap {r['gateway_cuts']:.0f} times "
                  f"({breakdown or 'none'}; signal/whose samples), withdrew {r['gateway_withdrawals']:.0f} and paused "
                  f"{r['gateway_pauses']:.0f} batch requests")
    for name in mixed_phases:
        r = by[name]
        print(f"{name}: online TTFT P99 {r['ttft_p99_ms'] / alone['ttft_p99_ms']:.2f}x alone, ITL P99 "
              f"{r['itl_p99_ms'] / alone['itl_p99_ms']:.2f}x alone (target <= 1.1x)")
    for mixed in (name for name in mixed_phases if "no classes" not in name):  # the job's share, of its own C
        job = f"{mixed.split(',')[0].removeprefix('online + ')} alone"
        if job not in by or mixed not in by:
            continue
        capacity = by[job]["job_output_tokens"] / by[job]["job_wall_s"]
        used = alone["online_output_tok_s"] / capacity if capacity else 0.0
        allowed = capacity * max(0.0, 1 - used)
        reached = by[mixed]["job_output_tokens"] / by[mixed]["job_wall_s"]
        print(f"{mixed}: job capacity C = {capacity:.0f} tok/s, online used U = {used:.1%}, idle capacity allows "
              f"{allowed:.0f} tok/s; the job reached {reached:.0f} = {reached / allowed if allowed else 0:.0%} (target >= 70%)")
    jobs = [r for r in results if "job_rows" in r]
    same = all(r["job_rows"] == args.rows == r["job_distinct_ids"] and r["job_row_errors"] == 0 and r["job_short"] == 0
               for r in jobs) and all(not r.get("online_errors") for r in results)
    print(f"same work (every job: {args.rows} rows in = out, one per id, 0 row errors, every answer "
          f"{args.max_tokens} tokens; 0 online errors): {same}", flush=True)
    if not same:
        raise SystemExit("a job or the online traffic did not do the same work: the ratios compare nothing")


def spark_variant(spec: str) -> tuple[str, dict]:
    name, sep, settings = spec.partition("=")
    try:
        classes = json.loads(settings) if sep and name.strip() else None
    except json.JSONDecodeError:
        classes = None
    if not isinstance(classes, dict):
        raise argparse.ArgumentTypeError(f"{spec!r}: give NAME=JSON object, e.g. 'cutpause={{\"pause_batch_on_cut\": true}}'")
    return name.strip(), classes


def api_variant(spec: str) -> tuple[str, list[str]]:
    name, sep, extra = spec.partition("=")
    if not sep or not name.strip() or not name.replace("_", "").replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"{spec!r}: give NAME=GATEWAY ARGS, e.g. 'lenient=--interactive-slowdown-target 1.25'")
    return name.strip(), shlex.split(extra)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", choices=("vllm", "mock"), default="vllm")
    parser.add_argument("--seconds", type=float, default=45.0, help="Length of the online-alone phase")
    parser.add_argument("--rate", type=float, default=1.0, help="Online requests per second (Poisson)")
    parser.add_argument("--online-words", type=int, default=60)
    parser.add_argument("--online-max-tokens", type=int, default=32)
    parser.add_argument("--rows", type=int, default=300, help="Rows of each job (Spark and Batch API)")
    parser.add_argument("--batch-words", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64, help="Tokens per job row (ignore_eos)")
    parser.add_argument("--spark-cores", type=int, default=2)
    parser.add_argument("--spark-nice", type=int, default=0, metavar="N",
                        help="Run Spark's JVM and Python workers at this niceness (0: as the engines). On a small "
                             "machine they share the engines' cores, which a deployment's executors do not")
    parser.add_argument("--spark-in-flight", type=int, default=8, help="Rows in flight per Spark task")
    parser.add_argument("--batch-api-concurrency", type=int, default=16, help="The gateway's --batch-concurrency")
    parser.add_argument("--warmup-s", type=float, default=3.0,
                        help="Unmeasured online traffic through each fresh gateway before its first phase")
    parser.add_argument("--job-timeout-s", type=float, default=1800.0)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--targets", choices=("relative", "absolute"), default="relative",
                        help="The controller's --interactive-targets, for the gateway and the Spark job")
    parser.add_argument("--ttft-target-ms", type=float, default=1000.0,
                        help="--interactive-ttft-target-ms, for the gateway and the Spark job")
    parser.add_argument("--itl-target-ms", type=float, default=200.0,
                        help="--interactive-itl-target-ms, for the gateway and the Spark job")
    parser.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                        help="Passed to the gateway, e.g. --gateway-arg=--batch-max-kv-usage --gateway-arg=0.8")
    parser.add_argument("--api-variant", action="append", default=[], metavar="NAME=ARGS", type=api_variant,
                        help="With the api phase: run its online + Batch API phase first through a second gateway "
                        "with these extra arguments, e.g. 'lenient=--interactive-slowdown-target 1.25' (repeatable)")
    parser.add_argument("--spark-variant", action="append", default=[], metavar="NAME=JSON", type=spark_variant,
                        help="With the spark phase: run its online + Spark phase first with these service-class "
                        "settings for the job's routers, e.g. 'cutpause={\"pause_batch_on_cut\": true}' (repeatable)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--phases", type=lambda v: v.split(","), default=["spark", "api", "no-classes"],
                        help="Which phases run after online alone: spark, spark-steps, api, no-classes (comma-separated)")
    add_worker_options(parser)
    args = parser.parse_args()
    unknown = set(args.phases) - {"spark", "spark-steps", "api", "no-classes"}
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(sorted(unknown))}: choose from spark, spark-steps, api, no-classes")
    for variants, phase in ((args.spark_variant, "spark"), (args.api_variant, "api")):
        if variants and phase not in args.phases:
            parser.error(f"--{phase}-variant needs the {phase} phase (its capacity C and the default to compare with)")
    return args


def main() -> None:
    args = parse_args()
    print(f"online: Poisson {args.rate}/s, {args.online_words} words, max_tokens {args.online_max_tokens}; jobs: "
          f"{args.rows} rows of {args.batch_words} words, max_tokens {args.max_tokens}; controller {args.targets}, "
          f"TTFT {args.ttft_target_ms:g} ms, ITL {args.itl_target_ms:g} ms; gateway args: "
          f"{' '.join(args.gateway_arg) or '(none)'}", flush=True)
    report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    sys.exit(main())
