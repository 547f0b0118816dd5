"""Benchmark harness: load generator, workloads, metrics, reports and plots.

    config = BenchConfig(target="http://127.0.0.1:8000", workload="mix", rate="1,2,4", duration=60)
    report = await run_bench(config)

Targets: any OpenAI-compatible HTTP server, workers over gRPC, or the router in-process.
"""

from vllm_fleet.bench.arrivals import ArrivalProcess
from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.metrics import Slo, percentile, summarize
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.run import run_bench

__all__ = ["ArrivalProcess", "BenchConfig", "RequestRecord", "Slo", "percentile", "run_bench", "summarize"]
