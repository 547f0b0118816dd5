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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from vllm_fleet.processes import exit_on_sigterm  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from report import _ms, judge, render, side_summary  # noqa: E402
from stacks import Stack, log, start_ours, start_smg  # noqa: E402

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
    """py-spy's samples of our gateway by component (benchmarks/probes/gateway_profile.py's table of
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
