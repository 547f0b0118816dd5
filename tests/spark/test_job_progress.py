"""Live progress of a Spark job (spark/progress.py): each task's running totals over UDP to the driver."""

from __future__ import annotations

import socket

from support import wait_until
from vllm_fleet.spark.progress import ProgressListener, ProgressReporter, Totals, progress_line


async def test_the_listener_sums_each_tasks_latest_totals_and_a_retry_replaces_its_attempt():
    listener = ProgressListener()
    try:
        first = ProgressReporter(listener.address, "3:0")
        second = ProgressReporter(listener.address, "3:1")
        for _ in range(5):
            first.row_done(error=False, tokens=10)
        first.row_done(error=True, tokens=0)
        second.row_done(error=False, tokens=7)
        first.close()
        second.close()
        await wait_until(lambda: listener.totals() == Totals(rows=7, errors=1, tokens=57), timeout=10,
                         message="both tasks' totals")
        retried = ProgressReporter(listener.address, "3:1")  # Spark retries partition 1: counted once
        retried.row_done(error=False, tokens=7)
        retried.row_done(error=False, tokens=7)
        retried.close()
        await wait_until(lambda: listener.totals() == Totals(rows=8, errors=1, tokens=64), timeout=10,
                         message="the retry's totals in place of its failed attempt's")
        stray = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # not ours: ignored, the listener goes on
        host, _, port = listener.address.rpartition(":")
        stray.sendto(b"not json", (host, int(port)))
        stray.close()
        last = ProgressReporter(listener.address, "3:2")
        last.close()  # a task with no rows still reports
        await wait_until(lambda: listener.totals() == Totals(rows=8, errors=1, tokens=64), timeout=10,
                         message="totals unchanged")
    finally:
        listener.close()


def test_a_reporter_without_a_listener_counts_and_sends_nothing():
    reporter = ProgressReporter(None, "local")
    reporter.row_done(error=False, tokens=3)
    reporter.close()
    assert reporter.totals == Totals(rows=1, errors=0, tokens=3)


def test_the_progress_line_a_person_reads():
    assert progress_line(Totals(rows=120, errors=1, tokens=3100), 1000, 10.0) == \
        "rows 120/1000 (12%)  12.0 rows/s  310 tokens/s  ETA 1m13s  errors 1"
    assert progress_line(Totals(), 1000, 5.0) == "rows 0/1000 (0%)  0.0 rows/s  0 tokens/s  ETA unknown"
    assert progress_line(Totals(rows=10), 100_000, 10.0).endswith("ETA 27h46m")  # 99,990 s at 1 row/s
    assert progress_line(Totals(rows=4, tokens=8), None, 2.0) == "rows 4  2.0 rows/s  4 tokens/s"
