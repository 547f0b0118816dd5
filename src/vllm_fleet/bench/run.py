"""One benchmark end to end: target + workload + runner → report (written when asked)."""

from __future__ import annotations

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.report import build_report, write_all
from vllm_fleet.bench.runner import Runner
from vllm_fleet.bench.targets import make_target
from vllm_fleet.bench.workloads import make_workload


async def run_bench(config: BenchConfig) -> dict:
    """Run every load of `config` and return the report; write it under `config.output` if set."""
    target = make_target(config)
    workload = make_workload(config)
    runs = await Runner(target, workload, config).run()
    report = build_report(config, runs, target=target.describe(), workload=workload.describe())
    if config.output:
        report["files"] = [str(p) for p in write_all(report, config.output)]
    return report
