"""Session affinity vs round robin on two real vLLM workers: prefix-cache hits and P99 TTFT.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/session_affinity.py [--conversations 16 --turns 6]

Starts two real vLLM workers (default model) on disjoint cores (`--cpu-cores 0` and `1`),
then runs the same multi-turn chat workload through the Router twice, once per policy.
Each conversation sends its turns one after another, with the whole history (the model's own
answers included), all conversations at once. Session affinity should keep a conversation on
the worker that already holds its history in the prefix cache; round robin scatters it.

Figures per policy:
- cached share: sum(usage.cached_tokens) / sum(usage.prompt_tokens) over the run's requests
  (exact per run, from the workers' usage);
- each worker's lifetime `WorkerLoad.prefix_cache_hit_rate` before and after the run;
- TTFT P50/P99 (router.stream() to the first chunk with tokens), and the run's wall time.

Each run uses its own conversation texts (a per-run salt), so the second run cannot hit
what the first one cached. A warm-up request per worker runs before both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
import zlib

import numpy as np

from vllm_fleet.bench import percentile
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import ChatMessage, GenerateInput
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig

SYSTEM = "You are a concise assistant. Answer in one or two sentences."
TOPICS = ("rivers", "mountains", "cities", "forests", "oceans", "deserts", "islands", "volcanoes",
          "glaciers", "lakes", "valleys", "canyons")
WORDS = ("describe compare explain history climate people animals plants travel weather season trade "
         "ancient modern famous largest smallest oldest culture food music language map route").split()


def vllm_worker(cores: str) -> WorkerProcess:
    return WorkerProcess([*small_vllm_args(), "--enable-prefix-caching"], {"VLLM_FLEET_LOG_LEVEL": "WARNING"},
                         cores=cores, log_path=f"/tmp/session-affinity-worker-{cores}.log")


def user_turn(rng: np.random.Generator, salt: str, conversation: int, turn: int, words: int) -> str:
    topic = TOPICS[conversation % len(TOPICS)]
    filler = " ".join(rng.choice(WORDS, size=words))
    return f"[{salt}/{conversation}/{turn}] Tell me about {topic}: {filler}?"


async def conversation(router: Router, index: int, args: argparse.Namespace, salt: str,
                       ttfts: list[float], usages: list[tuple[int, int]], retried: list[int]) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{salt}-{index}".encode()))
    messages = [ChatMessage("system", SYSTEM)]
    loop = asyncio.get_running_loop()
    for turn in range(args.turns):
        messages.append(ChatMessage("user", user_turn(rng, salt, index, turn, args.user_words)))
        request = build_request(
            f"{salt}-c{index}-t{turn}", [GenerateInput(messages=list(messages))],
            SamplingParams(max_tokens=args.max_tokens, temperature=0.0), session_id=f"{salt}-conversation-{index}",
        )
        started = loop.time()
        answer = ""
        first = None
        async with router.stream(request) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = loop.time() - started
                answer += chunk.text
                if chunk.usage is not None:
                    usages.append((chunk.usage.prompt_tokens, chunk.usage.cached_tokens))
        retried[0] += stream.attempts - 1
        ttfts.append(first if first is not None else loop.time() - started)
        messages.append(ChatMessage("assistant", answer))


async def hit_rates(addresses: list[str]) -> list[float]:
    rates = []
    for address in addresses:
        async with WorkerClient(address) as client:
            rates.append((await client.load()).prefix_cache_hit_rate)
    return rates


async def run_policy(policy: str, addresses: list[str], args: argparse.Namespace) -> dict:
    router = Router(StaticRegistry.from_spec(addresses), RouterConfig(policy=policy))
    await router.start()
    try:
        await router.wait_ready(timeout=60)
        before = await hit_rates(addresses)
        ttfts: list[float] = []
        usages: list[tuple[int, int]] = []
        retried = [0]
        started = time.perf_counter()
        await asyncio.gather(*(conversation(router, i, args, policy, ttfts, usages, retried)
                               for i in range(args.conversations)))
        wall = time.perf_counter() - started
        after = await hit_rates(addresses)
    finally:
        await router.close()
    prompt = sum(p for p, _ in usages)
    cached = sum(c for _, c in usages)
    return {
        "policy": policy, "requests": len(ttfts), "wall_s": wall, "retried": retried[0],
        "cached_share": cached / prompt if prompt else 0.0, "prompt_tokens": prompt,
        "ttft_p50_ms": percentile(ttfts, 50) * 1000, "ttft_p99_ms": percentile(ttfts, 99) * 1000,
        "hit_rate_before": before, "hit_rate_after": after,
    }


async def main(args: argparse.Namespace) -> None:
    # Stop cleanly on SIGTERM/SIGINT too (a background job ignores SIGINT): leaving the block below
    # must stop the workers, or two 3 GB engines outlive the benchmark.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    async with contextlib.AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(vllm_worker(cores)) for cores in ("0", "1")]
        addresses = [worker.address for worker in workers]
        for worker in workers:
            await worker.wait_serving(600)
            async with WorkerClient(worker.address) as client:
                info = await client.info()
                # Warm-up: the first request of an engine pays one-off costs neither policy should.
                warm = build_request(f"warm-{worker.address}",
                                     [GenerateInput(messages=[ChatMessage("user", "Hello")])],
                                     SamplingParams(max_tokens=8))
                async for _ in client.generate(warm, timeout=120):
                    pass
        print(f"workers: {addresses} model={info.model} block_size={info.settings.get('block_size')} "
              f"prefix_caching={info.settings.get('enable_prefix_caching')}")
        print(f"workload: {args.conversations} conversations x {args.turns} turns, all at once, "
              f"{args.user_words} words per user turn, max_tokens={args.max_tokens}, temperature 0")
        results = [await run_policy(policy, addresses, args) for policy in ("round_robin", "session_affinity")]
    print()
    print("| policy | requests | cached share of prompt tokens | worker hit rate before -> after | "
          "TTFT P50 | TTFT P99 | wall | retried |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        rates = ", ".join(f"{b:.2f}->{a:.2f}" for b, a in zip(r["hit_rate_before"], r["hit_rate_after"]))
        print(f"| {r['policy']} | {r['requests']} | {r['cached_share']:.1%} ({r['prompt_tokens']} prompt tokens) | "
              f"{rates} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p99_ms']:.0f} ms | {r['wall_s']:.1f} s | {r['retried']} |")
    rr, sa = results
    if sa["ttft_p99_ms"] > 0:
        print(f"\nP99 TTFT round_robin / session_affinity = {rr['ttft_p99_ms'] / sa['ttft_p99_ms']:.2f}x; "
              f"cached share {rr['cached_share']:.1%} -> {sa['cached_share']:.1%}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16, help="Conversations run at once")
    parser.add_argument("--turns", type=int, default=6, help="Turns per conversation")
    parser.add_argument("--user-words", type=int, default=32, help="Words per user turn")
    parser.add_argument("--max-tokens", type=int, default=32, help="Answer length per turn")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
