"""Live progress of a Spark job (spark/progress.py): each task's running totals over UDP to the driver."""

from __future__ import annotations

import asyncio
import socket

from support import wait_until
from vllm_fleet.router import BatchWaitStatus
from vllm_fleet.spark.progress import ProgressListener, ProgressReporter, Totals, Waiting, progress_line


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


async def test_a_tasks_heartbeat_carries_why_its_rows_wait_for_batch_capacity():
    # Rows waiting for slack finish nothing; the heartbeat still says, from the router's account.
    reason = "no worker of model 'm' has batch slack: w1 has 3 request(s) waiting in its engine"
    status = {"now": BatchWaitStatus(waiting=2, since=1.0, waited_s=12.0, reason=reason)}
    listener = ProgressListener()
    try:
        reporter = ProgressReporter(listener.address, "4:0", waiting=lambda: status["now"])
        heartbeat = asyncio.create_task(reporter.heartbeat())
        await wait_until(lambda: listener.waiting() is not None, timeout=10, message="the waiting report")
        waiting = listener.waiting()
        assert waiting.requests == 2 and waiting.reason == reason and waiting.waited_s >= 12.0
        line = progress_line(Totals(rows=3, tokens=30), 10, 10.0, waiting)
        assert line.startswith("rows 3/10 (30%)") and f"  waiting for batch capacity: {reason} (2 requests, " in line
        status["now"] = BatchWaitStatus()  # slack came back
        await wait_until(lambda: listener.waiting() is None, timeout=10, message="the wait cleared")
        heartbeat.cancel()
        reporter.close()
    finally:
        listener.close()


def test_a_short_wait_for_a_freed_slot_is_not_shown():
    assert "waiting" not in progress_line(Totals(rows=3), 10, 10.0, Waiting(1, 0.4, "no worker has batch slack"))
    assert "waiting for batch capacity: no worker has batch slack (1 requests, 6s)" in \
        progress_line(Totals(rows=3), 10, 10.0, Waiting(1, 6.0, "no worker has batch slack"))
