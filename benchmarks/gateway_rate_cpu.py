"""Issue #49 goal 3: streamed completions at a set rate through one gateway host, mock engines at a GPU's pace.

    python benchmarks/gateway_rate_cpu.py --rate 200 --tokens 512 --seconds 20 --processes 4 \
        --mock-workers 4 --client-processes 6 [--src A/src --src B/src] [--rounds 2]

Open loop (Poisson arrivals at `--rate` req/s for `--seconds`, split over `--client-processes`
load generators), each a streamed completion of exactly `--tokens` tokens. Behind the gateway
(`--processes N`), `--mock-workers` mock workers step every running sequence together every
10 ms (`--mock-batched-steps`, one token per sequence per step: 100 tokens/s, a small model's
decode pace on a GPU), so a worker message carries one step of all its streams, as a vLLM
worker's does (`--mock-tokens-per-s` sets that pace: TPOT's floor). Per side: achieved rate, errors,
TTFT P50/P90/P99, TPOT and E2E P50/P99 beside the engine's own token time (pooled over the load
generators), output tokens/s, SSE events per token, and the gateway's CPU (all its processes,
/proc) per token and tokens per gateway CPU-second. With several `--src`, the sides alternate
order each round. The load generators and mock workers run on the same host: the command prints
their CPU too, so a host whose cores they fill shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as overhead  # noqa: E402
from proc_stat import cpu_seconds  # noqa: E402

from vllm_fleet.bench import ArrivalProcess, percentile  # noqa: E402
from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.models import ensure_default_model  # noqa: E402
from vllm_fleet.processes import GatewayProcess  # noqa: E402


def with_src(src: str) -> str:
    """PYTHONPATH with the checkout's src/ first; what was on it stays after (a staged site folder)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip("/").endswith("src")]
    return os.pathsep.join([str(Path(src).resolve()), *rest])


WORDS = ("river mountain fleet token cache worker gateway stream answer engine table column north south "
         "east west light dark quick slow paper stone water fire").split()


def _prompts(words: int, seed: int):
    """The fixed prompt every time (words 0), else `words` random words a request, each prompt its
    own (issue #49 goal 2's workload: prompts that share nothing, as vLLM's bench `random` sends)."""
    rng = random.Random(seed)
    while True:
        yield overhead.PROMPT if words <= 0 else " ".join(rng.choice(WORDS) for _ in range(words))


async def _load(port: int, rate: float, seconds: float, tokens: int, seed: int, prompt_words: int = 0) -> dict:
    prompts = _prompts(prompt_words, seed)

    def body() -> bytes:
        return json.dumps({"model": overhead.MODEL, "prompt": next(prompts), "max_tokens": tokens, "stream": True,
                           "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    times = ArrivalProcess(rate, seed=seed).times(max(1, int(rate * seconds)))
    ttfts: list[float] = []
    tpots: list[float] = []   # (last text event - first) / (tokens - 1), as vLLM's bench client counts it
    e2es: list[float] = []
    got_tokens, errors, events = 0, 0, 0
    first_errors: list[str] = []

    async def one(request_body: bytes) -> None:
        nonlocal got_tokens, errors, events
        conn = overhead.HttpConnection("127.0.0.1", port)
        try:
            await conn.open()
            sent_at = time.perf_counter()
            ttft, n = await conn.stream("/v1/completions", request_body, sent_at)
            events += conn.events
            if ttft is None or n != tokens:
                errors += 1
                if len(first_errors) < 3:
                    first_errors.append(f"{n} tokens of {tokens}, first text {'seen' if ttft else 'never seen'}")
            else:
                ttfts.append(ttft)
                e2es.append(conn.last_text_at - sent_at)
                if n > 1:
                    tpots.append((conn.last_text_at - sent_at - ttft) / (n - 1))
                got_tokens += n
        except Exception as exc:
            errors += 1
            if len(first_errors) < 3:
                first_errors.append(repr(exc))
        finally:
            conn.close()

    start = time.perf_counter()
    tasks = []
    for planned in times:
        delay = start + planned - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(body())))
    sent_over = time.perf_counter() - start
    await asyncio.gather(*tasks)
    return {"ttfts": ttfts, "tpots": tpots, "e2es": e2es, "tokens": got_tokens, "errors": errors,
            "first_errors": first_errors, "events": events, "sent": len(times),
            "sent_over_s": sent_over, "elapsed_s": time.perf_counter() - start}


def _load_process(port: int, rate: float, seconds: float, tokens: int, seed: int, prompt_words: int, out) -> None:
    out.put(overhead.run_on_uvloop(_load(port, rate, seconds, tokens, seed, prompt_words)))


def _run_load(port: int, args: argparse.Namespace) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    share = args.rate / args.client_processes
    procs = [context.Process(target=_load_process, args=(port, share, args.seconds, args.tokens, 1000 + i,
                                                                   getattr(args, "prompt_words", 0), out))
             for i in range(args.client_processes)]
    for proc in procs:
        proc.start()
    parts = [out.get(timeout=args.seconds + 600) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    return parts


def _profile(pid: int, args: argparse.Namespace, label: str) -> subprocess.Popen | None:
    """py-spy on the gateway for the measured load (it costs the gateway CPU: such a run measures nothing)."""
    if not args.py_spy:
        return None
    out = Path(args.py_spy_out) / f"gateway-{label}-{time.strftime('%H%M%S')}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([args.py_spy, "record", "--pid", str(pid), "--rate", "200", "--duration",
                             str(int(args.seconds)), "--format", "raw", "--nonblocking", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one_side(src: str | None, args: argparse.Namespace, extra_gateway_args: list[str] = (),
                   label: str = "defaults") -> dict:
    env = {**overhead.QUIET, **({"PYTHONPATH": with_src(src)} if src else {})}
    # With a real tokenizer and a prefix cache the mock gives a cache-aware gateway what a vLLM
    # worker does (tokenizer files, block size), so its per-request decision is on the path.
    real_prompts = ["--mock-tokenizer", str(ensure_default_model()), "--mock-kv-blocks", "65536"] if args.real_tokenizer else []
    workers = [WorkerProcess(["--engine", "mock", "--served-model-name", overhead.MODEL, "--mock-ttft-ms",
                              str(args.mock_ttft_ms), "--mock-tokens-per-s", str(args.mock_tokens_per_s), "--mock-batched-steps",
                              "--mock-max-model-len", "65536", *real_prompts],
                             env, stop_grace_s=20) for _ in range(args.mock_workers)]
    for worker in workers:
        await worker.__aenter__()
    try:
        for worker in workers:
            await worker.wait_serving(120)
        gateway_args = ["--workers", ",".join(w.address for w in workers), "--no-access-log",
                        *(["--processes", str(args.processes)] if args.processes != 1 else []), *extra_gateway_args]
        async with GatewayProcess(gateway_args, env, stop_grace_s=20) as gateway:
            await gateway.wait_ready(120)
            warm_up = argparse.Namespace(rate=min(args.rate, 20), seconds=1.0, tokens=16, client_processes=1,
                                         prompt_words=args.prompt_words)
            await asyncio.to_thread(_run_load, gateway.port, warm_up)
            # A cache-aware gateway keys prompts once it has loaded the workers' tokenizer (seconds of
            # its CPU): warm up until it has, so that the measured load neither pays for the load
            # nor goes unkeyed.
            deadline, index_before = time.monotonic() + 120, _cache_index(gateway.port)
            while index_before is not None and time.monotonic() < deadline and _loading(index_before):
                await asyncio.to_thread(_run_load, gateway.port, warm_up)
                index_before, earlier = _cache_index(gateway.port), index_before
                all_keyed = index_before["routed_without_ids"] == earlier["routed_without_ids"]
                if "tokenizers" not in index_before and all_keyed:
                    break   # a tree before the index said its tokenizers: a round all keyed
            g0, w0 = cpu_seconds(gateway.pid), sum(cpu_seconds(w.pid) for w in workers)
            c0, started = _children_cpu(), time.perf_counter()
            profiler = _profile(gateway.pid, args, label)
            parts = await asyncio.to_thread(_run_load, gateway.port, args)
            if profiler is not None:
                profiler.wait(timeout=args.seconds + 60)
            elapsed = time.perf_counter() - started
            index_after = _cache_index(gateway.port)
            g_cpu = cpu_seconds(gateway.pid) - g0
            w_cpu = sum(cpu_seconds(w.pid) for w in workers) - w0
            c_cpu = _children_cpu() - c0
    finally:
        for worker in reversed(workers):
            await worker.__aexit__(None, None, None)
    ttfts = [t for p in parts for t in p["ttfts"]]
    tokens = sum(p["tokens"] for p in parts)
    sent = sum(p["sent"] for p in parts)
    tpots = [t for p in parts for t in p["tpots"]]
    e2es = [t for p in parts for t in p["e2es"]]
    ms = lambda q, values=ttfts: round(percentile(values, q) * 1000, 2) if values else None  # noqa: E731
    return {"rate": args.rate, "achieved_rate": round(sent / max(p["sent_over_s"] for p in parts), 1),
            "requests": sent, "errors": sum(p["errors"] for p in parts),
            "first_errors": [e for p in parts for e in p["first_errors"]][:3], "processes": args.processes,
            "mock_workers": args.mock_workers, "prompt_words": args.prompt_words,
            **({} if index_before is None else {
                "tokenizers": index_after.get("tokenizers"),
                "routed_without_ids": index_after["routed_without_ids"] - index_before["routed_without_ids"],
                "routed_without_choice":
                    index_after.get("routed_without_choice", 0) - index_before.get("routed_without_choice", 0)}),
            "ttft_p50_ms": ms(50), "ttft_p90_ms": ms(90), "ttft_p99_ms": ms(99),
            "engine_token_ms": round(1000 / args.mock_tokens_per_s, 2), "tpot_p50_ms": ms(50, tpots),
            "tpot_p99_ms": ms(99, tpots), "e2e_p50_ms": ms(50, e2es), "e2e_p99_ms": ms(99, e2es),
            "tokens": tokens, "tokens_per_s": round(tokens / elapsed), "events_per_token":
            round(sum(p["events"] for p in parts) / max(tokens, 1), 3), "gateway_cpu_s": round(g_cpu, 2),
            "gateway_us_per_token": round(g_cpu / max(tokens, 1) * 1e6, 1),
            "tokens_per_gateway_cpu_s": round(tokens / max(g_cpu, 1e-9)), "workers_cpu_s": round(w_cpu, 2),
            "load_generators_cpu_s": round(c_cpu, 2), "elapsed_s": round(elapsed, 1),
            "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def _loading(index: dict) -> bool:
    tokenizers = index.get("tokenizers")
    return tokenizers is None or not tokenizers or "loading" in tokenizers.values()


def _cache_index(port: int) -> dict | None:
    """The gateway's cache index counters (one gateway process's), None when it keeps none (not
    cache_aware): requests routed without ids or without a choice, each model's tokenizer state."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/state.json", timeout=10) as response:
        index = json.load(response).get("cache_index") or []
    return index[0] if index else None


def _children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


async def main(args: argparse.Namespace) -> None:
    # Sides: each --src with the gateway's defaults, then each --gateway-variant on the first src.
    sides = [(src, "defaults" if not args.gateway_arg else " ".join(args.gateway_arg), list(args.gateway_arg))
             for src in (args.src or [None])]
    for variant in args.gateway_variant or []:
        label, _, gateway_args = variant.partition("=")
        sides.append((sides[0][0], label, [*args.gateway_arg, *gateway_args.split()]))
    for round_ in range(args.rounds):
        for src, label, extra in (sides if round_ % 2 == 0 else sides[::-1]):
            result = await one_side(src, args, extra, label)
            print(json.dumps({"round": round_, "src": src or "this checkout", "gateway": label, **result}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=1, help="gateway --processes N")
    parser.add_argument("--mock-workers", type=int, default=1)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--mock-tokens-per-s", type=float, default=100.0,
                        help="the mock engine's decode pace (one step of every sequence per 1/N s): TPOT's floor")
    parser.add_argument("--mock-ttft-ms", type=float, default=20.0)
    parser.add_argument("--prompt-words", type=int, default=0,
                        help="each request's prompt: this many random words, shared by no other request (0: one fixed prompt)")
    parser.add_argument("--real-tokenizer", action="store_true",
                        help="the mock workers tokenize with the packaged SmolLM2's tokenizer and keep a prefix cache, "
                             "so a --policy cache_aware gateway fetches the tokenizer and keys every prompt (#49 goal 2)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--src", action="append", help="a checkout's src/ (repeat to compare; default: this one)")
    parser.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                        help="an argument for every side's gateway (repeat: --gateway-arg=--policy --gateway-arg=cache_aware)")
    parser.add_argument("--gateway-variant", action="append", metavar="LABEL=ARGS",
                        help="one more side: the gateway with these arguments (e.g. 'grouped=--stream-interval-ms 50')")
    parser.add_argument("--py-spy", metavar="PY_SPY", help="profile the gateway with this py-spy (a diagnosis: "
                        "the profiler's own CPU lands on the gateway, so the run's figures compare nothing)")
    parser.add_argument("--py-spy-out", default="py-spy", help="folder for the collapsed stacks")
    overhead.run_on_uvloop(main(parser.parse_args()))
