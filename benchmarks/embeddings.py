"""Embeddings per second through the gateway vs `vllm serve`, same model, same inputs, one run.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/embeddings.py [--texts 2048] [--batch 16]
        [--concurrency 8] [--rounds 2]

Two servers of the packaged all-MiniLM-L6-v2 (float32, eager), both up for the whole run, one
under load at a time:
  fleet: `vllm-fleet worker --model all-minilm-l6-v2` + `vllm-fleet gateway` (HTTP → gRPC → AsyncLLM)
  vllm:  `python -m vllm.entrypoints.openai.api_server` on the same model folder
Both take every core (vLLM's default binding). The client (this process, httpx) sends the same
`--texts` texts as POST /v1/embeddings requests of `--batch` inputs, `--concurrency` at a time,
and checks every answer has one 384-float vector per input. Rounds alternate fleet, vllm, fleet,
vllm, ... so drift on a shared machine hits both; the figure is the ratio of the median rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import httpx

from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.models import ensure_embedding_model
from vllm_fleet.processes import GatewayProcess, ServiceProcess, free_port

MODEL = "all-MiniLM-L6-v2"
QUIET = {"VLLM_FLEET_LOG_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": "1"}
WORDS = ("river mountain cat tea chess train winter market code music bread light storm city garden "
         "ocean paper stone glass forest").split()


def texts(count: int) -> list[str]:
    """Deterministic sentences of 8-40 words."""
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8 + i % 33)) for i in range(count)]


async def run_load(url: str, inputs: list[str], batch: int, concurrency: int) -> float:
    """Embeddings per second for all `inputs`, `batch` per request, `concurrency` requests out."""
    batches = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    queue = list(reversed(batches))
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency)) as http:
        async def one_client() -> None:
            while queue:
                chunk = queue.pop()
                reply = await http.post("/v1/embeddings", json={"model": MODEL, "input": chunk,
                                                                "encoding_format": "float"})
                reply.raise_for_status()
                data = reply.json()["data"]
                assert len(data) == len(chunk) and all(len(d["embedding"]) == 384 for d in data)

        await http.post("/v1/embeddings", json={"model": MODEL, "input": inputs[:batch]})  # warm
        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return len(inputs) / (time.perf_counter() - started)


async def start_fleet(folder: str) -> list[ServiceProcess]:
    env = {**os.environ, **QUIET}
    worker = WorkerProcess(["--engine", "vllm", "--model", "all-minilm-l6-v2", "--dtype", "float32",
                            "--enforce-eager", "--max-model-len", "256"], env).start()
    await worker.wait_serving(600)
    gateway = GatewayProcess(["--workers", worker.address, "--no-access-log"], env).start()
    await gateway.wait_ready(120)
    return [gateway, worker]


async def start_vllm(folder: str) -> tuple[ServiceProcess, str]:
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--served-model-name", MODEL, "--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
               "--host", "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.2",
               "--disable-uvicorn-access-log"]
    server = ServiceProcess(command, {**os.environ, **QUIET}, name=f"vllm serve :{port}").start()
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                return (await http.get(url + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    await server.wait_for(ready, 600)
    return server, url


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    folder = str(ensure_embedding_model())
    inputs = texts(args.texts)
    print(f"model {MODEL} ({os.path.basename(folder)}, unpacked in the user cache); {args.texts} texts, {args.batch} per request, {args.concurrency} concurrent; "
          f"cores {os.cpu_count()}", flush=True)
    results: dict[str, list[float]] = {"fleet": [], "vllm": []}
    processes = await start_fleet(folder)
    try:
        server, vllm_url = await start_vllm(folder)
        processes.append(server)
        urls = {"fleet": processes[0].url, "vllm": vllm_url}
        for round_ in range(args.rounds):
            for side in ("fleet", "vllm"):
                rate = await run_load(urls[side], inputs, args.batch, args.concurrency)
                results[side].append(rate)
                print(f"round {round_ + 1} {side:5s}: {rate:8.1f} embeddings/s", flush=True)
    finally:
        for process in processes:
            process.stop()
    fleet, vllm = statistics.median(results["fleet"]), statistics.median(results["vllm"])
    print(f"median fleet {fleet:.1f}/s, vllm serve {vllm:.1f}/s: ratio fleet/vllm = {fleet / vllm:.3f} "
          f"(target >= 0.95)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
