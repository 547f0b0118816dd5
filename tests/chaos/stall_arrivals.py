"""One real worker whose EngineCore is stopped mid-answer while new requests keep arriving (#28).

Shared by tests/chaos/test_stall_arrivals.py (one case, in CI) and benchmarks/stall_arrivals.py
(detection time against the arrival rate and prompt length). Four long streams run on a real
worker; SIGSTOP of its EngineCore process stalls them while the worker's gRPC loop stays alive;
from then on new requests arrive at `rate_per_s`, each a prompt of about `prompt_words` words
that the worker renders and tokenizes in its own process. Detection time: from the SIGSTOP to
the worker saying NOT_SERVING (or exiting), as its client sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass

import psutil

from support import WorkerProcess, vllm_worker_args, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request

STREAMS = 4
STREAM_TOKENS = 400


@dataclass
class StallOutcome:
    detection_s: float
    arrivals: int
    exit_code: int | None


def _engine_cores(worker_pid: int) -> list[psutil.Process]:
    children = psutil.Process(worker_pid).children(recursive=True)
    return [p for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]


async def said_stalled(worker: WorkerProcess, client: WorkerClient) -> bool:
    """The worker's stall verdict as its client sees it: NOT_SERVING, or the process gone."""
    if worker.returncode is not None:
        return True
    try:
        return await client.health(timeout=1.0) == "NOT_SERVING"
    except Exception:
        return False   # no answer is not a verdict on a loaded machine


async def _drain(client: WorkerClient, rid: str, prompt: str, tokens: int, seen: list[int]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    with contextlib.suppress(Exception):   # the stalled worker fails them: that is the point
        async for chunk in client.generate(build_request(rid, [GenerateInput(text=prompt)], params), timeout=300):
            seen.append(len(chunk.token_ids))


async def stall_with_arrivals(rate_per_s: float, prompt_words: int, cores: str = "0") -> StallOutcome:
    args, env = vllm_worker_args(cores)
    worker = WorkerProcess(args, env).start()
    tasks: list[asyncio.Task] = []
    try:
        await worker.wait_serving(600)
        async with WorkerClient(worker.address) as client:
            seen: list[int] = []
            tasks += [asyncio.create_task(_drain(client, f"long-{i}", f"Tell story number {i}.", STREAM_TOKENS, seen))
                      for i in range(STREAMS)]
            await wait_until(lambda: sum(seen) >= 4 * STREAMS, timeout=120, message="the streams decoding")
            cores_ = _engine_cores(worker.pid)
            assert cores_, "no EngineCore process under the worker"
            for core in cores_:
                os.kill(core.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            prompt = " ".join(["word"] * prompt_words)
            arrivals = 0

            async def arrive() -> None:
                nonlocal arrivals
                while rate_per_s > 0:
                    arrivals += 1
                    tasks.append(asyncio.create_task(_drain(client, f"new-{arrivals}", prompt, 16, [])))
                    await asyncio.sleep(1 / rate_per_s)   # pacing the load, not synchronisation

            arriving = asyncio.create_task(arrive())
            tasks.append(arriving)

            await wait_until(lambda: said_stalled(worker, client), timeout=120, interval=0.1,
                             message="the stall detected")
            detection_s = time.monotonic() - stopped_at
            arriving.cancel()
            return StallOutcome(detection_s, arrivals, worker.returncode)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        worker.kill()   # its process group: the stopped EngineCore with it
