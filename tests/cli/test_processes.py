"""Scripts that start worker processes clean them up when they are stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support import wait_until

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A stand-in for a benchmark: starts a long-lived child in its own session, stops it in `finally`.
SCRIPT = """
import subprocess, sys, time
from vllm_fleet.processes import exit_on_sigterm, stop_process_group
exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
try:
    time.sleep(600)
finally:
    stop_process_group(child, grace_s=5)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose; only a running process counts.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def test_sigterm_runs_the_cleanup_that_stops_started_workers():
    script = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC})
    child = int(script.stdout.readline())
    assert alive(child)
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=30) == 128 + signal.SIGTERM
    await wait_until(lambda: not alive(child), timeout=10, message="the script's child survived SIGTERM")
