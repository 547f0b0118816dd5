"""`vllm-fleet spark-run` as a user runs it: a subprocess with its own Spark, on mock workers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest


async def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    command = [sys.executable, "-m", "vllm_fleet.cli", "spark-run", "--master", "local[2]",
               "--conf", "spark.driver.memory=1g", "--conf", "spark.ui.enabled=false", *args]
    return await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=600)


async def test_spark_run_writes_every_row_and_a_summary(mock_pair, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": f"cli question {i}"}) + "\n" for i in range(50)))
    output = tmp_path / "answers.parquet"
    done = await run_cli("--input", str(source), "--output", str(output), "--max-tokens", "5",
                         "--workers", ",".join(w.address for w in mock_pair))

    assert done.returncode == 0, done.stderr[-2000:]
    assert "rows: 50  errors: 0  output tokens: 250" in done.stdout
    table = pq.read_table(output).to_pydict()
    assert sorted(table["id"]) == list(range(50)) and all(table["output"]) and not any(table["error"])
    assert "/1 tasks" in done.stderr or "tasks" in done.stderr, "a progress line while the job ran"


async def test_spark_run_refuses_a_missing_column(mock_pair, tmp_path):
    source = tmp_path / "prompts.csv"
    source.write_text("id,question\n1,hello\n")
    done = await run_cli("--input", str(source), "--output", str(tmp_path / "out.parquet"),
                         "--workers", mock_pair[0].address)

    assert done.returncode == 2
    assert "prompt_col='prompt': no such column; the DataFrame has id, question" in done.stderr
    assert not (tmp_path / "out.parquet").exists()


async def test_spark_run_output_schema_writes_typed_columns_and_counts_rows_that_do_not_read(mock_pair, tmp_path):
    # The mock answers with words, not JSON: every row keeps its text and gets the row error.
    source = tmp_path / "people.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": f"person {i}"}) + "\n" for i in range(5)))
    output = tmp_path / "people.parquet"
    done = await run_cli("--input", str(source), "--output", str(output), "--max-tokens", "4",
                         "--workers", mock_pair[0].address, "--output-schema", "name STRING, age INT")

    assert done.returncode == 1, done.stderr[-2000:]
    assert "rows: 5  errors: 5" in done.stdout and "output is not valid JSON for the schema" in done.stdout
    table = pq.read_table(output)
    assert str(table.schema.field("name").type) == "string" and str(table.schema.field("age").type) == "int32"
    assert table.column("age").null_count == 5 and all(table.column("output").to_pylist())


async def test_spark_run_refuses_an_output_schema_without_a_json_form(mock_pair, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text(json.dumps({"prompt": "hello"}) + "\n")
    done = await run_cli("--input", str(source), "--output", str(tmp_path / "out.parquet"),
                         "--workers", mock_pair[0].address, "--output-schema", "photo BINARY")

    assert done.returncode == 2
    assert "output_schema field photo is binary, which has no JSON form" in done.stderr


@pytest.fixture(scope="module")
async def slow_worker(module_mock_workers):
    """20 tokens/s and 4 engine slots, for the jobs that must run long enough to be watched; each
    test's job ends with nothing running on it."""
    return await module_mock_workers.start(max_num_seqs=4, mock_tokens_per_s=20, mock_ttft_ms=1)


async def test_spark_run_shows_rows_tokens_and_an_eta_while_one_partition_runs(slow_worker, tmp_path):
    # One input file, one partition: Spark's own progress would say "0/1 tasks" until the end.
    # Two rows at a time at 20 tokens/s: the job runs for seconds, reported every half second.
    worker = slow_worker
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"slow question {i}"}) + "\n" for i in range(24)))
    done = await run_cli("--input", str(source), "--output", str(tmp_path / "out.parquet"), "--max-tokens", "5",
                         "--max-in-flight", "2", "--workers", worker.address)

    assert done.returncode == 0, done.stderr[-2000:]
    shown = [int(m.group(1)) for m in re.finditer(r"rows (\d+)/24 \(\d+%\)  [\d.]+ rows/s  \d+ tokens/s  ETA ",
                                                   done.stderr)]
    assert shown and shown[-1] == 24, done.stderr[-2000:]
    assert any(0 < rows < 24 for rows in shown), f"rows counted while the one task ran: {shown} {done.stderr[-3000:]!r}"


async def test_spark_run_says_why_rows_wait_for_batch_capacity_and_the_wait_fails_no_row(slow_worker, tmp_path):
    # Every slot is kept for interactive work (90% of 4 is all of them): the starvation guard's
    # one request is all batch may run, so the second row waits ~10 s for the first (200 tokens
    # at 20 tokens/s). Its 15 s request_timeout_s is less than its wait and its work together:
    # the wait must not count against it.
    worker = slow_worker
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"long question {i}"}) + "\n" for i in range(2)))
    router = {"classes": {"interactive_reserve": 0.9, "batch_min_share": 0.0}}
    done = await run_cli("--input", str(source), "--output", str(tmp_path / "out.parquet"), "--max-tokens", "200",
                         "--max-in-flight", "2", "--request-timeout-s", "15", "--router", json.dumps(router),
                         "--workers", worker.address)

    assert done.returncode == 0, done.stderr[-2000:]  # both rows answered
    assert "errors: 0" in done.stdout
    assert re.search(r"waiting for batch capacity: no worker of model '[^']+' has batch slack: "
                     + re.escape(f"{worker.address} running 1 >= batch cap 0 (interactive_reserve 0.9 of "
                                 "max_num_seqs 4)") + r".* \(1 requests, \d+s\)", done.stderr), done.stderr[-3000:]
