"""One worker process: `vllm-fleet worker` started, waited on and stopped the same way
wherever it is needed: by the node supervisor (which adds restarts), the demo, the tests and
the benchmarks.

    async with WorkerProcess(["--engine", "mock"]) as worker:
        await worker.wait_serving(timeout=30)    # ProcessStartError with its log tail if it dies
        async with WorkerClient(worker.address) as client: ...
    # drained (SIGTERM), then its whole process group is SIGKILLed: vLLM's engine core too

Real vLLM on a small CPU machine: `WorkerProcess(small_vllm_args(), cores="0")`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_fleet.client import WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig, to_options
from vllm_fleet.processes import ServiceProcess, free_port


def worker_argv(worker: WorkerConfig, engine: EngineConfig | None = None, args: Sequence[str] = (), *,
                python: str = sys.executable) -> list[str]:
    """`python -m vllm_fleet.cli worker` with the fields set in `worker` and `engine`, then `args`
    as given. The one place the worker's command line is written: a plan's workers
    (`WorkerSpec.argv()`) and a WorkerProcess given args start the same command."""
    engine_options = to_options(engine) if engine is not None else []
    return [python, "-m", "vllm_fleet.cli", "worker", *to_options(worker), *engine_options, *args]


def small_vllm_args(*, kv_cache_space_gb: float = 1, max_model_len: int = 2048) -> list[str]:
    """Worker options for a real vLLM engine that starts fast and stays small.

    enforce_eager starts in ~30 s instead of ~100 s (no graph capture); a 1 GB KV cache and a
    2048-token context keep a worker at ~3 GB, so two or three fit beside Spark on a 24 GB machine.
    """
    return ["--engine", "vllm", "--enforce-eager", "--max-model-len", str(max_model_len),
            "--kv-cache-space-gb", f"{kv_cache_space_gb:g}"]


class WorkerProcess(ServiceProcess):
    """`python -m vllm_fleet.cli worker --host HOST --port PORT [--cpu-cores CORES] ARGS`.

    `port` defaults to a free one; `cores` binds the engine to those CPU cores. `command`
    replaces the whole command line, args and cores included (e.g. a plan's `WorkerSpec.argv()`),
    and must then serve on host:port. To run another checkout's code, pass
    env={"PYTHONPATH": "/that/checkout/src"}.
    """

    def __init__(self, args: Sequence[str] = (), env: Mapping[str, str] | None = None, *, port: int | None = None,
                 host: str = "127.0.0.1", cores: str | None = None, log_path: str | Path | None = None,
                 python: str = sys.executable, command: Sequence[str] | None = None, die_with_parent: bool = False,
                 stop_grace_s: float = 60.0) -> None:
        self.args = list(args)
        self.host = host
        self.port = port or free_port(host)
        self.cores = cores
        if command is not None and (self.args or cores is not None):
            raise ValueError("WorkerProcess: give `command`, or `args` and `cores`, not both")
        if command is None:
            bind = EngineConfig(cpu_cores=cores) if cores is not None else None
            command = worker_argv(WorkerConfig(host=host, port=self.port), bind, self.args, python=python)
        super().__init__(command, env, log_path=log_path, name=f"worker {self.address}",
                         die_with_parent=die_with_parent, stop_grace_s=stop_grace_s)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def wait_serving(self, timeout: float) -> None:
        """Until the worker's gRPC health says SERVING. Raises ProcessStartError, ending with the
        worker's log, if it exits first or is not SERVING within `timeout` seconds."""
        async with WorkerClient(self.address) as client:
            async def serving() -> bool:
                return await client.health(timeout=1.0) == "SERVING"

            await self.wait_for(serving, timeout)
