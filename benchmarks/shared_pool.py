"""Online and batch on the same two workers: online latency with batch running, with and without
service classes, batch throughput against what the idle capacity allows, and the recovery
after the online rate steps up.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/shared_pool.py --workers vllm

On a GPU host (vLLM 0.26), both workers on GPU 0 with dummy weights of a bigger model:

    python benchmarks/shared_pool.py --workers vllm --model Qwen/Qwen3.5-9B --cuda-devices 0,0 \
        --max-model-len 4096 --worker-arg=--load-format --worker-arg=dummy \
        --worker-arg=--gpu-memory-utilization --worker-arg=0.4 \
        --worker-arg=--engine-arg --worker-arg=language_model_only=true

Phases, each on the same two workers (real vLLM engines on cores 0 and 1, or `--workers mock`
to rehearse the sequence), each with its own texts so no phase hits another's prefix cache:

1. batch alone: a closed loop of `--batch-in-flight` batch requests for `--seconds`; its output
   tokens/s is the fleet's batch capacity C.
2. online alone: chat requests arriving as a Poisson process at `--rate` per second.
3. online + batch with classes: phase 2's arrivals, and the batch loop as class "batch".
4. online + batch without classes: the same, batch sent as "interactive" (before this change).
5. step-up: phase 3, with the online rate doubled halfway through; how long after the step the
   online TTFT (the P99 of a sliding 2 s window of first tokens) is back under `--ttft-target-ms`,
   and under `--slowdown-target` times online alone's P99 (the issue's target; on a slow machine
   the absolute one can sit below what online alone gets, and then says nothing about batch).

Figures: online TTFT P50/P99 and ITL P99 (gaps between a stream's chunks), E2E P99; batch
output tokens/s. "What the idle capacity allows" = C × (1 − U), where U = online output
tokens/s ÷ C is the share of the fleet's token rate online traffic used in phase 2: batch in
phase 3 should reach ≥ 70 % of it. Ratios are taken within one run, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from vllm_fleet.bench import percentile
from worker_pair import worker_pair
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.classes.service_class import ServiceClassConfig

WORDS = ("river mountain city forest ocean desert island harbor bridge market castle garden library museum "
         "station tower village meadow orchard engine signal ledger contract policy schedule payment").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Online:
    """Per-request latency records of the online traffic."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.e2e: list[float] = []
        self.first_at: list[tuple[float, float]] = []  # (when the first token came, its TTFT)
        self.output_tokens = 0
        self.errors = 0


async def online_request(router: Router, rid: str, rng: random.Random, args, stats: Online) -> None:
    loop = asyncio.get_running_loop()
    request = build_request(rid, [GenerateInput(messages=[{"role": "user", "content": words(rng, args.online_words)}])],
                            SamplingParams(max_tokens=args.online_max_tokens, temperature=0.0, ignore_eos=True))
    started = loop.time()
    last = None
    try:
        async with router.stream(request) as stream:
            async for chunk in stream:
                if not chunk.token_ids:
                    continue
                now = loop.time()
                if last is None:
                    stats.ttft.append(now - started)
                    stats.first_at.append((now, now - started))
                else:
                    stats.itl.append(now - last)
                last = now
                stats.output_tokens += len(chunk.token_ids)
    except Exception:
        stats.errors += 1
        return
    stats.e2e.append(loop.time() - started)


async def online_traffic(router: Router, args, salt: str, seconds: float, stats: Online,
                         step_at: float | None = None) -> None:
    rng = random.Random(f"online-{salt}")
    arrivals = random.Random(args.seed)
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    i = 0
    while loop.time() - start < seconds:
        tasks.append(asyncio.create_task(online_request(router, f"{salt}-o{i}", rng, args, stats)))
        i += 1
        rate = args.rate * (2 if step_at is not None and loop.time() - start >= step_at else 1)
        await asyncio.sleep(arrivals.expovariate(rate))
    await asyncio.gather(*tasks)


async def batch_loop(router: Router, args, salt: str, service_class: str, stop: asyncio.Event) -> dict:
    rng = random.Random(f"batch-{salt}")
    done = {"output_tokens": 0, "requests": 0, "errors": 0, "withdrawn": 0, "paused": 0}

    async def one_lane(lane: int) -> None:
        k = 0
        while not stop.is_set():
            request = build_request(f"{salt}-b{lane}-{k}", [GenerateInput(text=words(rng, args.batch_words))],
                                    SamplingParams(max_tokens=args.batch_max_tokens, temperature=0.0,
                                                   ignore_eos=True), service_class=service_class)
            k += 1
            try:
                async with router.stream(request) as stream:
                    async for chunk in stream:
                        done["output_tokens"] += len(chunk.token_ids)
                    done["withdrawn"] += stream.withdrawals - stream.pauses
                    done["paused"] += stream.pauses
                done["requests"] += 1
            except Exception:
                done["errors"] += 1

    lanes = [asyncio.create_task(one_lane(i)) for i in range(args.batch_in_flight)]
    await stop.wait()
    for lane in lanes:
        lane.cancel()
    await asyncio.gather(*lanes, return_exceptions=True)
    return done


def summary(stats: Online) -> dict:
    return {
        "online_requests": len(stats.ttft), "online_errors": stats.errors,
        "ttft_p50_ms": percentile(stats.ttft, 50) * 1000, "ttft_p99_ms": percentile(stats.ttft, 99) * 1000,
        "itl_p99_ms": percentile(stats.itl, 99) * 1000, "e2e_p99_ms": percentile(stats.e2e, 99) * 1000,
        "online_output_tokens": stats.output_tokens,
    }


async def phase(name: str, addresses: list[str], args, *, online: bool, batch_class: str | None,
                step_at: float | None = None, alone_ttft_p99_ms: float | None = None) -> dict:
    classes = ServiceClassConfig(interactive_ttft_target_ms=args.ttft_target_ms,
                                 interactive_itl_target_ms=args.itl_target_ms,
                                 interactive_targets=args.targets, interactive_slowdown_target=args.slowdown_target)
    router = Router(StaticRegistry.from_spec(addresses), RouterConfig(policy="least_outstanding", classes=classes))
    await router.start()
    salt = f"{name}-{time.time_ns() % 100000}"
    try:
        await router.wait_ready(timeout=120)
        if online and args.warmup_s > 0:
            # Not measured: a fresh router's first requests (and an engine's first prompts of a
            # shape) are slow for reasons batch has no part in. Without this, online alone's P99
            # was its cold start (H100 12-05: P99 355 ms at P50 58), which flatters every ratio.
            await online_traffic(router, args, f"{salt}-warm", args.warmup_s, Online())
        stop = asyncio.Event()
        batch = asyncio.create_task(batch_loop(router, args, salt, batch_class, stop)) if batch_class else None
        stats = Online()
        started = time.perf_counter()
        if online:
            await online_traffic(router, args, salt, args.seconds, stats, step_at)
        else:
            await asyncio.sleep(args.seconds)
        wall = time.perf_counter() - started
        stop.set()
        batch_done = await batch if batch else None
        gate = router._batch  # the controller's own counts: cuts, and pauses for an arrival
        cuts, arrival_pauses = gate.cuts, gate.arrival_pauses
    finally:
        await router.close()
    result = {"phase": name, "wall_s": wall, **(summary(stats) if online else {})}
    if batch_done:
        result.update(batch_output_tok_s=batch_done["output_tokens"] / wall, batch_requests=batch_done["requests"],
                      batch_errors=batch_done["errors"], batch_withdrawn=batch_done["withdrawn"], batch_paused=batch_done["paused"],
                      batch_cuts=cuts, batch_paused_on_arrival=arrival_pauses)
    if online:
        result["online_output_tok_s"] = stats.output_tokens / wall
        if step_at is not None:
            result["recovery_s"] = recovery(stats, step_at, args.ttft_target_ms / 1000, started_at=stats.first_at)
            if alone_ttft_p99_ms:  # the target: within 1.1x online alone's P99 (the absolute one can sit below it)
                result["recovery_relative_s"] = recovery(stats, step_at, args.slowdown_target * alone_ttft_p99_ms / 1000,
                                                         started_at=stats.first_at)
    return result


def recovery(stats: Online, step_at: float, target_s: float, started_at) -> float | None:
    """Seconds after the step until every 2 s window of first tokens has its P99 TTFT under target."""
    if not started_at:
        return None
    origin = started_at[0][0] - started_at[0][1]  # ~ when traffic began
    step = origin + step_at
    points = sorted(started_at)
    last_bad = step
    window = 2.0
    t = step
    while t < points[-1][0]:
        inside = [ttft for at, ttft in points if t <= at < t + window]
        if inside and percentile(inside, 99) > target_s:
            last_bad = t + window
        t += 0.5
    return max(0.0, last_bad - step)


def worker_process(kind: str, cores: str, args) -> WorkerProcess:
    """Worker `cores` ("0" or "1", from worker_pair): pinned to that CPU core, or with
    `--cuda-devices` given, on that entry's GPU (CUDA_VISIBLE_DEVICES) and not pinned."""
    env = {"VLLM_FLEET_LOG_LEVEL": "WARNING", **dict(item.split("=", 1) for item in args.env)}
    pin: str | None = cores
    tag = f"core{cores}"
    if args.cuda_devices:
        env["CUDA_VISIBLE_DEVICES"] = args.cuda_devices[int(cores)]
        pin, tag = None, f"gpu{cores}-{args.cuda_devices[int(cores)]}"
    if kind == "vllm":
        model = ["--model", args.model] if args.model else []
        return WorkerProcess([*small_vllm_args(max_model_len=args.max_model_len), *model,
                              "--max-num-seqs", str(args.max_num_seqs), *args.worker_arg], env,
                             cores=pin, python=args.python, log_path=f"/tmp/shared-pool-worker-{tag}.log")
    return WorkerProcess(["--engine", "mock", "--max-num-seqs", str(args.max_num_seqs), "--mock-tokens-per-s", "40",
                          "--mock-ttft-ms", "20", "--mock-prefill-ms-per-1k", "200", *args.worker_arg], env, cores=pin,
                         python=args.python, log_path=f"/tmp/shared-pool-mock-{tag}.log")


async def main(args: argparse.Namespace) -> None:
    # Two engines on one GPU start in turn (worker_pair's docstring says why).
    sharing_a_gpu = bool(args.cuda_devices) and len(set(args.cuda_devices)) == 1
    async with worker_pair(lambda cores: worker_process(args.workers, cores, args),
                           one_after_another=sharing_a_gpu) as (addresses, info):
        placement = f"CUDA_VISIBLE_DEVICES {','.join(args.cuda_devices)}" if args.cuda_devices else "cores 0,1"
        print(f"workers: {args.workers} {addresses} ({placement}) model={info.model} "
              f"max_num_seqs={info.settings.get('max_num_seqs')} scheduling={info.settings.get('scheduling_policy', 'fcfs')}"
              + (f" worker args: {' '.join(args.worker_arg)}" if args.worker_arg else ""))
        print(f"online: Poisson {args.rate}/s, {args.online_words} words, max_tokens {args.online_max_tokens}; "
              f"batch: {args.batch_in_flight} in flight, {args.batch_words} words, max_tokens {args.batch_max_tokens}; "
              f"{args.seconds:.0f} s per phase")
        results = []
        for name, kw in [("batch alone", dict(online=False, batch_class="batch")),
                         ("online alone", dict(online=True, batch_class=None)),
                         ("online + batch, classes", dict(online=True, batch_class="batch")),
                         ("online + batch, no classes", dict(online=True, batch_class="interactive")),
                         ("step-up, classes", dict(online=True, batch_class="batch", step_at=args.seconds / 2))]:
            if "step_at" in kw:
                kw["alone_ttft_p99_ms"] = next(r["ttft_p99_ms"] for r in results if r["phase"] == "online alone")
            result = await phase(name, addresses, args, **kw)
            results.append(result)
            print(json.dumps(result), flush=True)
    by = {r["phase"]: r for r in results}
    alone, mixed, old = by["online alone"], by["online + batch, classes"], by["online + batch, no classes"]
    capacity = by["batch alone"]["batch_output_tok_s"]
    used = alone["online_output_tok_s"] / capacity if capacity else 0.0
    allowed = capacity * max(0.0, 1 - used)
    print()
    print("| phase | online TTFT P50 | TTFT P99 | ITL P99 | E2E P99 | batch output tok/s | batch withdrawn | batch paused |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['phase']} | {r.get('ttft_p50_ms', 0):.0f} ms | {r.get('ttft_p99_ms', 0):.0f} ms | "
              f"{r.get('itl_p99_ms', 0):.0f} ms | {r.get('e2e_p99_ms', 0):.0f} ms | "
              f"{r.get('batch_output_tok_s', 0):.1f} | {r.get('batch_withdrawn', 0)} | {r.get('batch_paused', 0)} |")
    print(f"\nonline TTFT P99 with batch / alone: classes {mixed['ttft_p99_ms'] / alone['ttft_p99_ms']:.2f}x, "
          f"no classes {old['ttft_p99_ms'] / alone['ttft_p99_ms']:.2f}x (target <= 1.1x)")
    print(f"online ITL P99 with batch / alone: classes {mixed['itl_p99_ms'] / alone['itl_p99_ms']:.2f}x, "
          f"no classes {old['itl_p99_ms'] / alone['itl_p99_ms']:.2f}x (target <= 1.1x)")
    print(f"batch capacity C = {capacity:.1f} tok/s; online used U = {used:.1%}; idle capacity allows "
          f"C x (1 - U) = {allowed:.1f} tok/s; batch with classes reached {mixed['batch_output_tok_s']:.1f} "
          f"= {mixed['batch_output_tok_s'] / allowed if allowed else 0:.0%} (target >= 70%)")
    print(f"step-up recovery: online P99 TTFT back under {args.ttft_target_ms:.0f} ms within "
          f"{by['step-up, classes'].get('recovery_s')} s of the step (target <= 2 s); under "
          f"{args.slowdown_target:g}x online alone's P99 ({args.slowdown_target * alone['ttft_p99_ms']:.0f} ms) within "
          f"{by['step-up, classes'].get('recovery_relative_s')} s")


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The worker command line options (shared with shared_pool_jobs.py)."""
    gpu = parser.add_argument_group("worker command line (defaults: the CPU run, the packaged model)")
    gpu.add_argument("--model", default=None, help="Worker --model (HF id or folder); default: the packaged model")
    gpu.add_argument("--max-model-len", type=int, default=2048, help="Worker --max-model-len")
    gpu.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                     help="Passed through to each worker's command line, in order; repeatable, e.g. "
                          "--worker-arg=--load-format --worker-arg=dummy --worker-arg=--engine-arg=language_model_only=true")
    gpu.add_argument("--cuda-devices", type=lambda s: s.split(","), default=None, metavar="D0,D1",
                     help="One CUDA_VISIBLE_DEVICES value per worker (e.g. 0,0: both on GPU 0) instead of CPU core pinning")
    gpu.add_argument("--python", default=sys.executable, help="Interpreter that runs the workers (default: this one)")
    gpu.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="Added to each worker's environment; repeatable")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", choices=("vllm", "mock"), default="vllm")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2.0, help="Online requests per second (Poisson)")
    parser.add_argument("--online-words", type=int, default=60)
    parser.add_argument("--online-max-tokens", type=int, default=32)
    parser.add_argument("--batch-in-flight", type=int, default=32)
    parser.add_argument("--batch-words", type=int, default=300)
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--ttft-target-ms", type=float, default=1000.0,
                        help="Online TTFT target: steers batch (--interactive-ttft-target-ms) and judges the step-up")
    parser.add_argument("--itl-target-ms", type=float, default=200.0,
                        help="Online gap between tokens that steers batch (--interactive-itl-target-ms)")
    parser.add_argument("--targets", choices=("relative", "absolute"), default="relative",
                        help="--interactive-targets: relative (the ms targets stand in until a baseline is learnt)")
    parser.add_argument("--slowdown-target", type=float, default=1.1, help="--interactive-slowdown-target")
    parser.add_argument("--warmup-s", type=float, default=3.0,
                        help="Unmeasured online traffic at the start of each online phase, before its batch")
    parser.add_argument("--seed", type=int, default=11)
    add_worker_options(parser)
    args = parser.parse_args()
    if args.cuda_devices is not None and len(args.cuda_devices) != 2:
        parser.error("--cuda-devices takes one value per worker: two, e.g. 0,0 or 0,1")
    if any("=" not in item for item in args.env):
        parser.error("--env takes KEY=VALUE")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
