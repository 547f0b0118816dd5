"""Stopping a worker subprocess and everything it started."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process_group(process: subprocess.Popen, *, grace_s: float = 60.0) -> None:
    """SIGTERM (a worker drains), wait up to `grace_s`, then SIGKILL the whole process group.

    The sweep matters: vLLM's engine core is a child process that outlives a killed parent.
    The process must have been started with `start_new_session=True`.
    """
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.wait(timeout=10)
