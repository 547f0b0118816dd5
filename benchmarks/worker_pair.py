"""Two workers on disjoint cores (0 and 1) for the side-by-side benchmarks, stopped on exit,
SIGTERM or SIGINT (a benchmark left behind must not leave two 3 GB engines running)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable

from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.protocol.types import WorkerInfo


@contextlib.asynccontextmanager
async def worker_pair(make: Callable[[str], WorkerProcess], *, start_timeout_s: float = 900,
                      one_after_another: bool = False, count: int = 2) -> AsyncIterator[tuple[list[str], WorkerInfo]]:
    """`make(cores)` builds each worker (`count` of them: two, or one that has a GPU to itself);
    yields their addresses and the first one's Info.

    one_after_another: start the second once the first serves. Two vLLM engines sharing one GPU
    must: each one's start-up memory profiling counts what the other allocates meanwhile as its
    own (the node starts GPU sharers in turn for the same reason)."""
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
