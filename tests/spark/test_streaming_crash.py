"""Structured Streaming under a crash, not a graceful stop: the driver is killed with SIGKILL in
the middle of a micro-batch and restarted from its checkpoint. Every input row comes out once,
and rows the answer ledger holds are not generated again. Also: the sink never shows half a
batch, even when a batch dies after some of its tasks committed their files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from support import free_port, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.spark import foreach_batch_writer

DRIVER = Path(__file__).with_name("stream_driver.py")
SRC = Path(__file__).resolve().parents[2] / "src"
FILES, ROWS_PER_FILE = 3, 24


def drop_file(folder: Path, name: str, ids: range) -> None:
    tmp = folder.parent / f".{name}"  # written aside then renamed: the source never sees half a file
    tmp.write_text("".join(json.dumps({"id": i, "prompt": f"crash question {i} about rivers"}) + "\n" for i in ids))
    tmp.rename(folder / name)


def ledger_lines(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    return sum(p.read_bytes().count(b"\n") for p in ledger.glob("*.jsonl"))


def committed_batches(sink: Path) -> list[str]:
    return sorted(p.name for p in sink.glob("batch_id=*")) if sink.exists() else []


def ok_requests(metrics_ports: list[int]) -> int:
    """Requests the workers answered to the end (Prometheus requests_total{outcome="ok"})."""
    total = 0.0
    for port in metrics_ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        total += sum(float(v) for v in re.findall(r'^vllm_fleet_worker_requests_total\{outcome="ok"\} (\S+)$', text, re.M))
    return int(total)


MARKER = "VLLM_FLEET_CRASH_TEST_DRIVER"


def driver_processes(tmp_path: Path) -> list[int]:
    """The pids of this test's driver and everything it started: they carry MARKER in their
    environment (PySpark's daemon puts itself and the executors' Python workers in a process
    group of their own, so killing the driver's group does not reach them)."""
    wanted = f"{MARKER}={tmp_path}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and wanted in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_driver(driver: subprocess.Popen, tmp_path: Path) -> None:
    """SIGKILL to the driver, its JVM and its executors' Python workers at once: the driver's host died."""
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in driver_processes(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    driver.wait(30)


def start_driver(tmp_path: Path, workers: list[str], attempt: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, MARKER: str(tmp_path)}
    log = open(tmp_path / f"driver-{attempt}.log", "wb")
    command = [sys.executable, str(DRIVER), "--source", str(tmp_path / "in"), "--sink", str(tmp_path / "out"),
               "--checkpoint", str(tmp_path / "checkpoint"), "--ledger", str(tmp_path / "ledger"),
               "--workers", ",".join(workers)]
    # Its own process group: SIGKILL to the group takes the Python driver and its JVM at once.
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def nothing_running(workers: list[str]) -> bool:
    for address in workers:
        async with WorkerClient(address) as client:
            if (await client.load()).running:
                return False
    return True


async def test_a_driver_killed_mid_batch_restarts_with_every_row_once_and_the_ledger_saves_work(
        tmp_path, mock_worker_factory):
    # Slow workers (8 tokens at 10/s: ~0.8 s a row, 8 rows in flight): a 24-row batch takes ~2.5 s.
    ports = [free_port(), free_port()]
    fleet = await asyncio.gather(*(mock_worker_factory.start(mock_tokens_per_s=10, mock_ttft_ms=5, metrics_port=port)
                                   for port in ports))
    workers = [w.address for w in fleet]
    (tmp_path / "in").mkdir()
    for n in range(FILES):
        drop_file(tmp_path / "in", f"part-{n}.json", range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
    rows_in = FILES * ROWS_PER_FILE
    ledger, sink = tmp_path / "ledger", tmp_path / "out"

    driver = start_driver(tmp_path, workers, 1)
    try:
        # Inside the first micro-batch: the workers answered some rows, the batch is not committed.
        await wait_until(lambda: ok_requests(ports) >= 4 or driver.poll() is not None, timeout=150,
                         message="the workers to answer the first rows")
        alive = driver.poll() is None
    finally:
        kill_driver(driver, tmp_path)
    assert alive, (tmp_path / "driver-1.log").read_text()[-3000:]
    assert committed_batches(sink) == [], "killed inside the first micro-batch"
    await wait_until(lambda: driver_processes(tmp_path) == [], timeout=30, message="the killed processes to be gone")
    await wait_until(lambda: nothing_running(workers), timeout=60, message="the killed executors' requests to end")
    answered_before_kill = ledger_lines(ledger)
    ok_before_restart = ok_requests(ports)

    driver = start_driver(tmp_path, workers, 2)
    try:
        returncode = await asyncio.to_thread(driver.wait, 170)
    finally:
        if driver.poll() is None:
            kill_driver(driver, tmp_path)
    assert returncode == 0, (tmp_path / "driver-2.log").read_text()[-3000:]

    table = ds.dataset(str(sink), format="parquet", partitioning="hive").to_table()
    ids = table.column("id").to_pylist()
    replayed = sum(1 for a, o in zip(table.column("attempts").to_pylist(), table.column("output").to_pylist())
                   if a == 0 and o is not None)
    generated_after_restart = ok_requests(ports) - ok_before_restart
    figures = dict(rows_in=rows_in, rows_out=len(ids), duplicates=len(ids) - len(set(ids)),
                   answered_before_kill=answered_before_kill, replayed=replayed,
                   generated_after_restart=generated_after_restart, batches=committed_batches(sink))
    print("crash figures:", figures)
    assert sorted(ids) == list(range(rows_in)), f"every row exactly once: {figures}"
    assert table.column("error").null_count == rows_in, "every row answered"
    assert replayed >= answered_before_kill > 0, f"rows answered before the kill come from the ledger: {figures}"
    assert generated_after_restart == rows_in - replayed < rows_in, f"the ledger saved work: {figures}"


def test_a_batch_that_dies_after_some_tasks_committed_shows_no_rows_until_its_replay(spark, tmp_path):
    """Hadoop's committer algorithm 2 moves each task's files into the output as the task commits.
    A batch whose second task fails after the first committed (as a driver killed mid-batch
    would) must leave nothing readers can see; its replay then writes it once."""
    sink = tmp_path / "out"
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("mapreduce.fileoutputcommitter.algorithm.version", "2")
    try:
        with pytest.raises(Exception, match="second task dies"):
            foreach_batch_writer(str(sink))(_batch(spark, str(sink), fail=True), 0)
        visible = spark.read.schema("id long").parquet(str(sink)).count() if committed_batches(sink) else 0
        assert visible == 0, "no row of an uncommitted batch is visible"

        foreach_batch_writer(str(sink))(_batch(spark, str(sink), fail=False), 0)   # the replay
        foreach_batch_writer(str(sink))(_batch(spark, str(sink), fail=False), 0)   # and once more: skipped
    finally:
        hadoop.unset("mapreduce.fileoutputcommitter.algorithm.version")
    assert sorted(r.id for r in spark.read.parquet(str(sink)).collect()) == list(range(20))


def _batch(spark, sink: str, *, fail: bool):
    def tasks(batches):
        import os
        import time

        from pyspark import TaskContext

        if fail and TaskContext.get().partitionId() == 1:
            # Until the first task's file is out of `_temporary` (committed), or 60 s.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                    "_temporary" not in folder and any(n.startswith("part-") for n in names)
                    for folder, _, names in os.walk(sink)):
                time.sleep(0.05)
            raise RuntimeError("the second task dies")
        yield from batches

    return spark.range(0, 20, numPartitions=2).mapInArrow(tasks, "id long")
