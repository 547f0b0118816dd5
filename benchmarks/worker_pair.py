"""Two workers on disjoint cores (0 and 1) for the side-by-side benchmarks, stopped on exit,
SIGTERM or SIGINT (a benchmark left behind must not leave two 3 GB engines running)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable

from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.protocol.types import WorkerInfo


def cuda_devices_arg(text: str) -> list[str]:
    """--cuda-devices: one CUDA_VISIBLE_DEVICES value per worker, one or two of them."""
    devices = text.split(",")
    if len(devices) not in (1, 2):
        raise argparse.ArgumentTypeError("one value per worker: one or two, e.g. 0, 0,0 or 0,1")
    return devices


@contextlib.asynccontextmanager
async def worker_pair(make: Callable[[str], WorkerProcess], *, start_timeout_s: float = 900,
                      cuda_devices: list[str] | None = None) -> AsyncIterator[tuple[list[str], WorkerInfo]]:
    """`make(cores)` builds each worker: two, or one per entry of `cuda_devices` (one: a worker
    with a GPU to itself); yields their addresses and the first one's Info.

    Two on one GPU start one after the other: each vLLM engine's start-up memory profiling counts
    what the other allocates meanwhile as its own (the node starts GPU sharers in turn too)."""
    count = len(cuda_devices) if cuda_devices else 2
    one_after_another = bool(cuda_devices) and count == 2 and len(set(cuda_devices)) == 1
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):  # a background job ignores SIGINT: cancel on both
        loop.add_signal_handler(sig, task.cancel)
    async with contextlib.AsyncExitStack() as stack:
        workers = []
        for cores in ("0", "1")[:count]:
            workers.append(await stack.enter_async_context(make(cores)))
            if one_after_another:
                await workers[-1].wait_serving(start_timeout_s)
        for worker in workers:
            await worker.wait_serving(start_timeout_s)
        addresses = [w.address for w in workers]
        async with WorkerClient(addresses[0]) as client:
            info = await client.info()
        yield addresses, info
