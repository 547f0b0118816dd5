"""Issue #49 goal 1: vLLM's own bench client against running front ends in turn, and the ratios.

    python benchmarks/gpu/vllm_client_grid.py --stock http://127.0.0.1:PORT1 --ours http://127.0.0.1:PORT2 \
        [--system lean=http://127.0.0.1:PORT3 ...] --model DIR [--rates 100,200,400] [--rounds 2] \
        [--out-len 64[,512...]] [--in-len 256] [--num-prompts 2000] [--results DIR] \
        [--py-spy BIN --profile NAME=PID ...]

Every system must already be up (same engine options, e.g. all resident on one GPU, started one
after the other; `benchmarks/gpu/run.sh grid` starts them). For each answer length, each (round,
rate) benches the systems in turn, in reversed order every other round, with
`vllm.benchmarks.serve` (random dataset, `--ignore-eos`, the same seed everywhere; `inf` as a rate
is saturation: every request at once), then prints each system / stock for TTFT, TPOT and E2E at P50
and P99, and for output throughput. The client's own JSON results are kept in --results (in
`out<N>/` per answer length when --out-len names several). Answer lengths run one after another,
both rounds of one before the next, so a run stopped at its time limit keeps whole lengths.

The bench runs in this process (vLLM imported once): a bench in its own process spent ~15 s of
every ~20 s importing vLLM before the first request.

While each bench runs, the CPU time of every process on the host is read from /proc before and
after; processes that used at least half a CPU-second are listed (100% = one core), so the table
says which process (front end, EngineCore, gateway, worker) did the work. With --py-spy, each
`--profile NAME=PID` process is sampled for a few seconds during the first round's first rate of
the system NAME, from a second after it gets busy (speedscope files in --results, read with
benchmarks/speedscope_top.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import threading
import time
from pathlib import Path

METRICS = [("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"), ("e2el", "p50"), ("e2el", "p99")]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> dict[int, tuple[float, str]]:
    """user + system CPU seconds (all threads) and a short command line of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry)] = ((int(fields[11]) + int(fields[12])) / TICK, command.strip()[:110])
    return found


def cpu_table(before: dict, after: dict, seconds: float) -> list[str]:
    rows = []
    for pid, (cpu, command) in after.items():
        used = cpu - before.get(pid, (0.0, ""))[0]
        if used >= 0.5:
            rows.append((used, f"  pid {pid:>7}  {used:7.1f} CPU-s  {100 * used / seconds:5.0f}%  {command}"))
    return [line for _, line in sorted(rows, reverse=True)]


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_until_busy(pid: int, share: float = 0.2, timeout: float = 120.0) -> None:
    """Until `pid` uses at least `share` of a core over half a second: the traffic has started
    (the client spends its first ~15 s building the dataset, which a fixed delay misjudged)."""
    deadline = time.monotonic() + timeout
    last = process_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = process_cpu(pid)
        if now - last >= share * 0.5:
            return
        last = now


def profile(py_spy: str, pid: int, out: Path, seconds: int) -> threading.Thread:
    def run() -> None:
        wait_until_busy(pid)
        time.sleep(1.0)  # past the first requests' prefill: the steady state
        subprocess.run([py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200",
                        "--format", "speedscope", "--output", str(out), "--nonblocking", "--subprocesses"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=False)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@functools.cache
def vllm_bench():
    """vLLM's `vllm bench serve`: its argument parser and entry point, imported once."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser, main


def bench(url: str, name: str, rate: str, out_len: int, count: int, out: Path, args: argparse.Namespace,
          profiles: list[tuple[str, int]]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    parser, run_bench = vllm_bench()
    command = ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
               "--model", args.served_name or args.model, "--tokenizer", args.model, "--dataset-name", "random",
               "--random-input-len", str(args.in_len), "--random-output-len", str(out_len), "--ignore-eos",
               "--num-prompts", str(count), "--request-rate", rate, "--seed", "0",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", f"{name}.json",
               "--num-warmups", str(args.warmups)]
    # --save-detailed: every request's TTFT and gaps, so a gap between sides can be placed in time
    # (a burst of slow steps, or all of them slower) and not only read off the percentiles.
    threads = [profile(args.py_spy, pid, out / f"{name}-{label}.speedscope.json", 5) for label, pid in profiles]
    before, started = cpu_by_process(), time.monotonic()
    run_bench(parser.parse_args(command))
    seconds = time.monotonic() - started
    print(f"CPU during {name} ({seconds:.1f} s, processes with >= 0.5 CPU-s):", flush=True)
    print("\n".join(cpu_table(before, cpu_by_process(), seconds)), flush=True)
    for thread in threads:
        thread.join(timeout=30)
    return json.loads((out / f"{name}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", required=True, help="base URL of stock `vllm serve`")
    parser.add_argument("--ours", required=True, help="base URL of our gateway")
    parser.add_argument("--system", action="append", default=[], metavar="NAME=URL",
                        help="another front end to bench beside them (e.g. our gateway over a worker with other options)")
    parser.add_argument("--model", required=True, help="the model folder (its tokenizer is the client's)")
    parser.add_argument("--served-name", help="the model's name on both servers (default: --model)")
    parser.add_argument("--rates", default="100,200,400")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-len", type=int, default=256)
    parser.add_argument("--out-len", default="64", help="answer lengths, comma-separated (one grid each)")
    parser.add_argument("--num-prompts", default="2000",
                        help="requests per bench: one number, or one per --out-len (comma-separated)")
    parser.add_argument("--warmups", type=int, default=0,
                        help="untimed requests before every bench (vLLM's --num-warmups): no first bench is cold")
    parser.add_argument("--results", default="/tmp/gpu-results/goal1")
    parser.add_argument("--py-spy", help="py-spy binary: sample the --profile processes once per system")
    parser.add_argument("--profile", action="append", default=[], metavar="SYSTEM=PID",
                        help="a process to sample while SYSTEM runs its first bench (needs --py-spy)")
    parser.add_argument("--profile-rate", help="sample in round 1's bench at this rate instead of the first "
                        "rate's (e.g. 200: where a gap shows)")
    args = parser.parse_args()
    sides = [("stock", args.stock), ("ours", args.ours)] + [tuple(s.split("=", 1)) for s in args.system]
    wanted: dict[str, list[tuple[str, int]]] = {}
    for item in args.profile if args.py_spy else []:
        system, pid = item.split("=", 1)
        wanted.setdefault(system, []).append((f"pid{pid}", int(pid)))
    rates = args.rates.split(",")
    if args.profile_rate and args.profile_rate not in rates:
        parser.error(f"--profile-rate {args.profile_rate} is not one of --rates {args.rates}")
    out_lens = [int(n) for n in args.out_len.split(",")]
    counts = [int(n) for n in args.num_prompts.split(",")]
    if len(counts) not in (1, len(out_lens)):
        parser.error(f"--num-prompts {args.num_prompts}: give one count, or one per --out-len {args.out_len}")
    counts *= len(out_lens) // len(counts)
    for out_len, count in zip(out_lens, counts):
        out = Path(args.results) / f"out{out_len}" if len(out_lens) > 1 else Path(args.results)
        results: dict[tuple[int, str, str], dict] = {}
        for round_ in range(1, args.rounds + 1):
            for rate in rates:
                for side, url in (sides if round_ % 2 else sides[::-1]):
                    first = round_ == 1 and rate == (args.profile_rate or rates[0]) and out_len == out_lens[0]
                    results[(round_, rate, side)] = bench(url, f"{side}-rate{rate}-r{round_}", rate, out_len, count,
                                                          out, args, wanted.get(side, []) if first else [])
        print_ratios(results, sides, rates, args.rounds, out_len)


def ratio(top: float, bottom: float) -> str:
    return f"{top / bottom:.3f}" if bottom else "n/a"  # a stand-in engine's whole answer can come in one chunk


def print_ratios(results: dict, sides: list, rates: list[str], rounds: int, out_len: int) -> None:
    for side, _ in sides[1:]:
        print(f"ratios {side} / stock, {out_len}-token answers (round: value):")
        for rate in rates:
            cells = []
            for metric, pct in [*METRICS, ("output_throughput", "")]:
                key = f"{pct}_{metric}_ms" if pct else metric
                ratios = [ratio(results[(r, rate, side)][key], results[(r, rate, "stock")][key])
                          for r in range(1, rounds + 1)]
                cells.append(f"{metric.replace('output_', '')} {pct}".rstrip() + " " + "/".join(ratios))
            # A ratio compares like with like only where both sides delivered the same tokens.
            differ = [r for r in range(1, rounds + 1) if results[(r, rate, side)]["total_output_tokens"]
                      != results[(r, rate, "stock")]["total_output_tokens"]]
            if differ:
                cells.append(f"DIFFERENT WORK in round(s) {differ}: output tokens differ from stock's")
            print(f"rate {rate}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
