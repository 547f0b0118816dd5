"""The bench against mock workers that produce tokens at a known pace: it must measure that pace.

The mock engine emits one token every 1/tokens_per_s seconds per sequence, so the bench's TPOT
must come out near 10 ms at 100 tokens/s through every target: gRPC workers, the router
in-process, and the gateway over HTTP. Tolerances are wide (the machine is shared); what is
checked is that the tool measures what it claims, not how fast anything is.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from support import free_port, wait_until
from vllm_fleet.bench import BenchConfig, run_bench

TOKENS_PER_S = 100.0


@pytest.fixture(scope="module")
async def paced_workers(module_mock_workers):
    return await module_mock_workers.start_many(2, mock_tokens_per_s=TOKENS_PER_S, mock_ttft_ms=20)


@pytest.fixture(scope="module")
async def gateway_url(paced_workers):
    """A gateway process in front of the paced workers, as a user would start it."""
    port = free_port()
    workers = ",".join(w.address for w in paced_workers)
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_fleet.cli", "gateway", "--workers", workers, "--port", str(port),
         "--policy", "session_affinity", "--no-access-log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    async def lists_a_model() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                reply = await client.get(url + "/v1/models", timeout=1.0)
            return reply.status_code == 200 and bool(reply.json()["data"])
        except httpx.HTTPError:
            return process.poll() is not None  # exited: fail below instead of waiting

    await wait_until(lists_a_model, timeout=30, message="gateway listing a model")
    assert process.poll() is None, "gateway exited"
    yield url
    process.terminate()
    process.wait(timeout=30)


def assert_measures_the_pace(report: dict, output_len: int) -> None:
    [run] = report["runs"]
    summary = run["summary"]
    assert summary["errors"] == {}
    assert summary["requests"]["completed"] == summary["requests"]["sent"] > 0
    measured = [r for r in run["requests"] if not r["warmup"]]
    assert all(r["output_tokens"] == output_len for r in measured)
    assert 7.0 <= summary["tpot_ms"]["p50"] <= 20.0, summary["tpot_ms"]
    assert 7.0 <= summary["itl_ms"]["p50"] <= 20.0, summary["itl_ms"]
    assert summary["ttft_ms"]["p50"] >= 15.0  # the mock waits 20 ms before its first token


async def test_grpc_target_measures_the_mock_token_rate(paced_workers):
    config = BenchConfig(target=f"grpc://{paced_workers[0].address}", workload="random", input_len=16,
                         output_len=20, rate="10", num_requests=20, progress=False)
    assert_measures_the_pace(await run_bench(config), 20)


async def test_fleet_target_routes_over_the_workers(paced_workers):
    config = BenchConfig(target="fleet", workers=",".join(w.address for w in paced_workers), policy="least_outstanding",
                         workload="random", input_len=16, output_len=20, concurrency="4", num_requests=20,
                         progress=False)
    assert_measures_the_pace(await run_bench(config), 20)


async def test_http_target_through_the_gateway(gateway_url):
    config = BenchConfig(target=gateway_url, workload="random", input_len=16, output_len=20, rate="10",
                         num_requests=20, progress=False)
    report = await run_bench(config)
    assert_measures_the_pace(report, 20)
    assert report["target"].endswith("(model mock-model)")


async def test_http_refusals_are_counted_by_status_and_the_bench_carries_on(gateway_url):
    # A wrong model name: every request is refused with 404; each is a data point, none a crash.
    config = BenchConfig(target=gateway_url, model="no-such-model", workload="random", input_len=8, output_len=4,
                         rate="20", num_requests=6, warmup_requests=0, progress=False)
    report = await run_bench(config)
    [run] = report["runs"]
    assert run["summary"]["errors"] == {"http_404": 6}
    assert all("no-such-model" in r["error_message"] for r in run["requests"])


async def test_mix_workload_through_the_gateway_keeps_sessions_and_counts_usage(gateway_url):
    config = BenchConfig(target=gateway_url, workload="mix", rate="20", num_requests=30, warmup_requests=0,
                         slo="ttft=10s", progress=False)
    report = await run_bench(config)
    [run] = report["runs"]
    assert run["summary"]["errors"] == {}
    assert {r["kind"] for r in run["requests"]} >= {"question", "conversation"}
    assert all(r["output_tokens"] == r["expected_output_tokens"] for r in run["requests"])
    assert all(r["prompt_tokens"] > 0 for r in run["requests"])
    assert run["summary"]["goodput"]["fraction"] == 1.0


async def test_a_sweep_runs_every_rate_and_skips_warmup(paced_workers):
    config = BenchConfig(target=f"grpc://{paced_workers[0].address}", input_len=8, output_len=5,
                         rate="5,inf", num_requests=6, warmup_requests=2, progress=False)
    report = await run_bench(config)
    assert [r["value"] for r in report["runs"]] == [5.0, "inf"]
    for run in report["runs"]:
        assert run["summary"]["requests"]["sent"] == 6
        assert sum(r["warmup"] for r in run["requests"]) == 2


async def test_unanswered_requests_are_cancelled_after_the_drain_timeout(module_mock_workers):
    slow = await module_mock_workers.start(mock_tokens_per_s=2, mock_ttft_ms=0)
    config = BenchConfig(target=f"grpc://{slow.address}", input_len=4, output_len=1000, rate="inf",
                         num_requests=2, warmup_requests=0, drain_timeout=0.5, progress=False)
    report = await run_bench(config)
    assert report["runs"][0]["summary"]["errors"] == {"unfinished": 2}


async def test_errors_are_counted_by_kind(paced_workers):
    # Prompts longer than the mock's 4,096-token context: the worker says INVALID_ARGUMENT.
    config = BenchConfig(target=f"grpc://{paced_workers[0].address}", input_len=5000, output_len=4, rate="inf",
                         num_requests=3, warmup_requests=0, prompt_format="tokens", progress=False)
    report = await run_bench(config)
    summary = report["runs"][0]["summary"]
    assert summary["errors"] == {"InvalidRequestError": 3}
    assert "context" in report["runs"][0]["requests"][0]["error_message"]


async def test_cli_run_writes_the_report_files(paced_workers, tmp_path):
    out = tmp_path / "run.json"
    result = subprocess.run(
        [sys.executable, "-m", "vllm_fleet.cli", "bench", "--target", f"grpc://{paced_workers[1].address}",
         "--input-len", "8", "--output-len", "6", "--concurrency", "2", "--num-requests", "6",
         "--slo", "ttft=2s", "--label", "cli-run", "--output", str(out)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "## Bench: cli-run" in result.stdout and "| conc 2 | 6/6 |" in result.stdout
    assert json.loads(out.read_text())["label"] == "cli-run"
    assert {p.name for p in tmp_path.iterdir()} == {"run.json", "run.md", "run-latency.png", "run-throughput.png"}


def test_cli_rejects_bad_options_with_a_clear_message():
    result = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "bench", "--target", "grpc://127.0.0.1:1",
                             "--rate", "2", "--concurrency", "4"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "not both" in result.stderr
