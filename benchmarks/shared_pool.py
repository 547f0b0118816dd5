"""Online and batch on the same two workers: online latency with batch running, with and without
service classes, batch throughput against what the idle capacity allows, and the recovery
after the online rate steps up (issue #52, "batch that online users cannot feel").

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/shared_pool.py --workers vllm

On the GPU machine (vLLM 0.26; after benchmarks/gpu/stage.sh install, `source /tmp/gpu-env.sh`),
both workers on GPU 0, the Qwen3-8B shape with dummy weights and make_model.py's stand-in
tokenizer (no chat template, hence --completions; it tells apart only the words t<N>, hence
--stand-in-words: every prompt word one token); CUDA graphs on, a step's budget 8192 tokens:

    source /tmp/gpu-env.sh && OUT=DIR bash benchmarks/gpu/pool_cache.sh pool8b

which runs, in benchmarks/ (~5.5 min: two engine starts one after the other, five 30 s phases):

    $FLEET_PY shared_pool.py --workers vllm --model "$QWEN3_8B" --cuda-devices 0,0 --max-model-len 2048 \\
        --worker-arg=--load-format --worker-arg=dummy --worker-arg=--gpu-memory-utilization --worker-arg=0.42 \\
        --worker-arg=--no-enforce-eager --worker-arg=--max-num-batched-tokens --worker-arg=8192 \\
        --completions --stand-in-words --max-num-seqs 64 --seconds 30 --rate 8 \\
        --online-words 256 --online-max-tokens 64 --batch-in-flight 128 --batch-words 512 --batch-max-tokens 128 \\
        --targets relative --ttft-target-ms 200 --itl-target-ms 63

Phases, each on the same two workers (real vLLM engines on cores 0 and 1, or `--workers mock`
to rehearse the sequence), each with its own texts so no phase hits another's prefix cache:

1. batch alone: a closed loop of `--batch-in-flight` batch requests for `--seconds`; its output
   tokens/s is the fleet's batch capacity C.
2. online alone: chat requests (`--completions`: one prompt text each) arriving as a Poisson
   process at `--rate` per second.
3. online + batch with classes: phase 2's arrivals, and the batch loop as class "batch" (the
   router's latency controller and the engine's class scheduler, the worker's default, both act).
4. online + batch without classes: the same, batch sent as "interactive": neither the router nor
   the engines see any batch, as in a pool without classes. Its gap to phase 3 is what classes remove.
5. step-up: phase 3, with the online rate doubled halfway through; how long after the step the
   online TTFT is back within target for good (every 1 s window of first tokens from then on has
   its P99 within it; 0.1 s resolution), for #52's target (1.05x online alone's P99) and for
   `--ttft-target-ms`.

Figures: online TTFT P50/P99 and ITL P99 (gaps between a stream's chunks), E2E P99; batch
output tokens/s. "What the idle capacity allows" = C x (1 - U), where U = online output
tokens/s / C is the share of the fleet's token rate online traffic used in phase 2. C is batch
as class batch, so the router keeps its interactive reserve (25 % of the slots) free: C is below
what the engines give batch with every slot (the no-classes phase's batch shows that). #52's
targets, each printed met or not: online TTFT P99 and ITL P99 with batch <= 1.05x online alone
while batch takes >= 80 % of what the idle capacity allows; back within target <= 1 s after the
online rate doubles. Ratios are taken within one run, side by side. The router's controller
steers by its own `--slowdown-target` (P90 against P90); the printout judges P99s against 1.05x.
`--alone-again` measures online alone a second time, right after the phase with batch, and prints
how far its P99s moved with nothing changed (on the H100, 83-118 ms between two identical runs):
a ratio within that spread is noise, not a reading.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import zlib

from vllm_fleet.bench import percentile
from worker_pair import cuda_devices_arg, worker_pair
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.classes.service_class import ServiceClassConfig
from pool_verdict import ALONE_AGAIN, TARGET_SLOWDOWN, verdict

WORDS = ("river mountain city forest ocean desert island harbor bridge market castle garden library museum "
         "station tower village meadow orchard engine signal ledger contract policy schedule payment").split()


# Where --stand-in-words spells words: t<N> for N in [1000, 101000), as cache_routing.py does
# (inside the vocabulary of every model config in benchmarks/gpu/configs).
STAND_IN_FIRST, STAND_IN_IDS = 1000, 100_000


def stand_in(word: str) -> str:
    """`word` spelled t<N>, N from its CRC32: make_model.py's stand-in tokenizer reads t<N> as
    token N and any other word as one unknown token, which would make every prompt the same
    tokens (and every prefill after the first a prefix-cache hit)."""
    return f"t{STAND_IN_FIRST + zlib.crc32(word.encode()) % STAND_IN_IDS}"


def words(rng: random.Random, n: int, vocabulary: list[str]) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(n))


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
    text = words(rng, args.online_words, args.vocabulary)
    item = GenerateInput(text=text) if args.completions else GenerateInput(messages=[{"role": "user", "content": text}])
    request = build_request(rid, [item],
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
            text = words(rng, args.batch_words, args.vocabulary)
            request = build_request(f"{salt}-b{lane}-{k}", [GenerateInput(text=text)],
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
            result["recovery_s"] = recovery(stats.first_at, step_at, args.ttft_target_ms / 1000)
            if alone_ttft_p99_ms:  # the target (the absolute one can sit below what online alone gets)
                result["recovery_relative_s"] = recovery(stats.first_at, step_at,
                                                         TARGET_SLOWDOWN * alone_ttft_p99_ms / 1000)
    return result


def recovery(first_at: list[tuple[float, float]], step_at: float, target_s: float,
             window_s: float = 1.0, slide_s: float = 0.1) -> float | None:
    """Seconds after the step until online TTFT is within target for good: the start of the first
    `window_s` window of first tokens (sliding by `slide_s`, the resolution) from which on every
    window has its P99 within `target_s`. `first_at`: (when the first token came, its TTFT)."""
    if not first_at:
        return None
    points = sorted(first_at)
    origin = points[0][0] - points[0][1]  # ~ when traffic began
    step = origin + step_at
    recovered_at = step
    t = step
    while t < points[-1][0]:
        inside = [ttft for at, ttft in points if t <= at < t + window_s]
        if inside and percentile(inside, 99) > target_s:
            recovered_at = t + slide_s
        t += slide_s
    return round(recovered_at - step, 2)


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
    async with worker_pair(lambda cores: worker_process(args.workers, cores, args),
                           cuda_devices=args.cuda_devices) as (addresses, info):
        placement = f"CUDA_VISIBLE_DEVICES {','.join(args.cuda_devices)}" if args.cuda_devices else "cores 0,1"
        print(f"workers: {args.workers} {addresses} ({placement}) model={info.model} "
              f"max_num_seqs={info.settings.get('max_num_seqs')} scheduling={info.settings.get('scheduling_policy', 'fcfs')} "
              f"scheduler={info.settings.get('scheduler_cls', '-')} kv_blocks={info.settings.get('num_kv_blocks', '-')}"
              + (f" worker args: {' '.join(args.worker_arg)}" if args.worker_arg else ""))
        print(f"online: {'completions' if args.completions else 'chat'}, Poisson {args.rate}/s, "
              f"{args.online_words} words{' (stand-in t<N>)' if args.stand_in_words else ''}, "
              f"max_tokens {args.online_max_tokens}; "
              f"batch: {args.batch_in_flight} in flight, {args.batch_words} words, max_tokens {args.batch_max_tokens}; "
              f"{args.seconds:.0f} s per phase")
        results = []
        phases = [("batch alone", dict(online=False, batch_class="batch")),
                  ("online alone", dict(online=True, batch_class=None)),
                  ("online + batch, classes", dict(online=True, batch_class="batch")),
                  ("online + batch, no classes", dict(online=True, batch_class="interactive")),
                  ("step-up, classes", dict(online=True, batch_class="batch", step_at=args.seconds / 2))]
        if args.alone_again:  # right after the phase it is compared with, as the first is right before
            phases.insert(3, (ALONE_AGAIN, dict(online=True, batch_class=None)))
        for name, kw in phases:
            if "step_at" in kw:
                kw["alone_ttft_p99_ms"] = next(r["ttft_p99_ms"] for r in results if r["phase"] == "online alone")
            result = await phase(name, addresses, args, **kw)
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    print("| phase | online TTFT P50 | TTFT P99 | ITL P99 | E2E P99 | batch output tok/s | batch withdrawn | batch paused |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['phase']} | {r.get('ttft_p50_ms', 0):.0f} ms | {r.get('ttft_p99_ms', 0):.0f} ms | "
              f"{r.get('itl_p99_ms', 0):.0f} ms | {r.get('e2e_p99_ms', 0):.0f} ms | "
              f"{r.get('batch_output_tok_s', 0):.1f} | {r.get('batch_withdrawn', 0)} | {r.get('batch_paused', 0)} |")
    print()
    for line in verdict({r["phase"]: r for r in results}, args):
        print(line)


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The worker command line options (shared with shared_pool_jobs.py)."""
    gpu = parser.add_argument_group("worker command line (defaults: the CPU run, the packaged model)")
    gpu.add_argument("--model", default=None, help="Worker --model (HF id or folder); default: the packaged model")
    gpu.add_argument("--max-model-len", type=int, default=2048, help="Worker --max-model-len")
    gpu.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                     help="Passed through to each worker's command line, in order; repeatable, e.g. "
                          "--worker-arg=--load-format --worker-arg=dummy --worker-arg=--engine-arg=language_model_only=true")
    gpu.add_argument("--cuda-devices", type=cuda_devices_arg, default=None, metavar="D0,D1",
                     help="One CUDA_VISIBLE_DEVICES value per worker (e.g. 0,0: both on GPU 0; 0: one worker "
                          "with GPU 0 to itself) instead of CPU core pinning")
    gpu.add_argument("--python", default=sys.executable, help="Interpreter that runs the workers (default: this one)")
    gpu.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="Added to each worker's environment; repeatable")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", choices=("vllm", "mock"), default="vllm")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--alone-again", action="store_true",
                        help="Measure online alone again right after the phase with batch: the spread of one P99")
    parser.add_argument("--rate", type=float, default=2.0, help="Online requests per second (Poisson)")
    parser.add_argument("--online-words", type=int, default=60)
    parser.add_argument("--online-max-tokens", type=int, default=32)
    parser.add_argument("--completions", action="store_true",
                        help="online requests as completions (one prompt text), not chat messages: for models "
                             "without a chat template, such as make_model.py's stand-in folders")
    parser.add_argument("--stand-in-words", action="store_true",
                        help="spell every prompt word t<N>, the only words benchmarks/gpu/make_model.py's "
                             "stand-in tokenizer tells apart (one token each)")
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
    if any("=" not in item for item in args.env):
        parser.error("--env takes KEY=VALUE")
    args.vocabulary = [stand_in(w) for w in WORDS] if args.stand_in_words else list(WORDS)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
