"""`vllm-fleet bench`: measure any OpenAI-compatible server, workers, or the router;
`vllm-fleet bench compare A.json B.json ...`: reports side by side."""

from __future__ import annotations

import argparse
import asyncio
import logging

from vllm_fleet.config import add_options, from_args
from vllm_fleet.errors import ConfigError

_EPILOG = """examples:
  vllm-fleet bench --target http://127.0.0.1:8000 --workload mix --rate 1,2,4 --duration 60 \\
      --slo ttft=500ms,tpot=50ms --output results/gateway.json --label gateway
  vllm-fleet bench --target grpc://127.0.0.1:50051 --workload random --input-len 256 --concurrency 8
  vllm-fleet bench --target fleet --workers 127.0.0.1:50051,127.0.0.1:50052 --rate 4 --num-requests 200
  vllm-fleet bench compare results/gateway.json results/vllm.json --plot results/compare
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from vllm_fleet.bench.config import BenchConfig

    parser = subparsers.add_parser(
        "bench", help="Benchmark a server, workers or the router; compare reports",
        description=__doc__, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("compare", nargs="*", metavar="compare REPORT.json",
                        help="'compare' followed by report files: print them side by side instead of running")
    parser.add_argument("--plot", metavar="STEM", help="With compare: also write STEM-latency.png and STEM-throughput.png")
    add_options(parser, BenchConfig)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args.compare, args.plot)
    from vllm_fleet.bench.config import BenchConfig
    from vllm_fleet.bench.report import markdown
    from vllm_fleet.bench.run import run_bench

    if not hasattr(args, "target"):
        raise ConfigError("--target is required (http://host:port, grpc://host:port or fleet)")
    config = from_args(BenchConfig, args)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the progress bar
    report = asyncio.run(run_bench(config))
    print(markdown(report))
    for path in report.get("files", []):
        print(f"wrote {path}")
    return 0


def _compare(words: list[str], plot: str | None) -> int:
    from vllm_fleet.bench.compare import compare_table
    from vllm_fleet.bench.plots import plot_reports
    from vllm_fleet.bench.report import read_report

    if words[0] != "compare" or len(words) < 2:
        raise ConfigError("usage: vllm-fleet bench compare A.json [B.json ...] (or run a bench with --target)")
    reports = [read_report(path) for path in words[1:]]
    print(compare_table(reports))
    if plot:
        for path in plot_reports(reports, plot):
            print(f"wrote {path}")
    return 0
