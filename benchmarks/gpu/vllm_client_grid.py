"""Issue #49 goal 1: vLLM's own bench client against two running front ends in turn, and the ratios.

    python benchmarks/gpu/vllm_client_grid.py --stock http://127.0.0.1:PORT1 --ours http://127.0.0.1:PORT2 \
        --model DIR [--rates 100,200,400] [--rounds 2] [--out-len 64] [--in-len 256] [--num-prompts 2000] \
        [--results DIR]

Both systems must already be up (same engine options, e.g. both resident on one GPU, started one
after the other; `benchmarks/gpu/run.sh short` with SHORT_SYSTEMS="stock fleet" starts them). Each
(round, rate) benches the two in turn, in alternating order per round, with
`vllm.benchmarks.serve` (random dataset, `--ignore-eos`, the same seed on both sides), then prints
ours / stock for TTFT, TPOT and E2E at P50 and P99, and for output throughput. The client's own
JSON results are kept in --results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
         "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
METRICS = [("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"), ("e2el", "p50"), ("e2el", "p99")]


def bench(url: str, name: str, rate: str, args: argparse.Namespace) -> dict:
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    command = [args.python, "-c", BENCH, "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
               "--model", args.served_name or args.model, "--tokenizer", args.model, "--dataset-name", "random",
               "--random-input-len", str(args.in_len), "--random-output-len", str(args.out_len), "--ignore-eos",
               "--num-prompts", str(args.num_prompts), "--request-rate", rate, "--seed", "0",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json"]
    subprocess.run(command, check=True)
    return json.loads((out / f"{name}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", required=True, help="base URL of stock `vllm serve`")
    parser.add_argument("--ours", required=True, help="base URL of our gateway")
    parser.add_argument("--model", required=True, help="the model folder (its tokenizer is the client's)")
    parser.add_argument("--served-name", help="the model's name on both servers (default: --model)")
    parser.add_argument("--rates", default="100,200,400")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-len", type=int, default=256)
    parser.add_argument("--out-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=2000)
    parser.add_argument("--results", default="/tmp/gpu-results/goal1")
    parser.add_argument("--python", default=sys.executable, help="a Python that imports vLLM")
    args = parser.parse_args()
    sides = [("stock", args.stock), ("ours", args.ours)]
    results: dict[tuple[int, str, str], dict] = {}
    for round_ in range(1, args.rounds + 1):
        for rate in args.rates.split(","):
            for side, url in (sides if round_ % 2 else sides[::-1]):
                results[(round_, rate, side)] = bench(url, f"{side}-rate{rate}-r{round_}", rate, args)
    print("ratios ours / stock (round: value):")
    for rate in args.rates.split(","):
        cells = []
        for metric, pct in METRICS:
            key = f"{pct}_{metric}_ms"
            ratios = [results[(r, rate, "ours")][key] / results[(r, rate, "stock")][key]
                      for r in range(1, args.rounds + 1)]
            cells.append(f"{metric} {pct} " + "/".join(f"{x:.3f}" for x in ratios))
        tput = [results[(r, rate, "ours")]["output_throughput"] / results[(r, rate, "stock")]["output_throughput"]
                for r in range(1, args.rounds + 1)]
        cells.append("throughput " + "/".join(f"{x:.3f}" for x in tput))
        print(f"rate {rate}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
