"""The shipped process helpers: a worker or gateway starts, says where it is, is waited on until
it serves, fails with its log when it cannot start, and leaves nothing behind when stopped.
Scripts that start worker processes clean them up when they are stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import ProcessStartError
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.processes import GatewayProcess, ServiceProcess
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A stand-in for a benchmark: starts a long-lived child in its own session, stops it in `finally`.
SCRIPT = """
import subprocess, sys, time
from vllm_fleet.processes import exit_on_sigterm, stop_process_group
exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
try:
    print(child.pid, flush=True)  # inside `try`: the test's SIGTERM may come as soon as it reads this
    time.sleep(600)
finally:
    stop_process_group(child, grace_s=5)
"""

# A stand-in for a vLLM worker: its child (the engine core) ignores SIGTERM and outlives it.
PARENT_WITH_STUBBORN_CHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('child up', flush=True); time.sleep(600)"])
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose; only a running process counts.
    return _stat(pid)[0] != "Z"


def _stat(pid: int) -> list[str]:
    """state, ppid, pgrp, ... of a process (the fields after its name in /proc/PID/stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                state, _, group = _stat(int(entry))[:3]
            except (OSError, IndexError):
                continue  # it exited while we looked
            if int(group) == pgid and state != "Z":
                members.append(int(entry))
    return members


async def test_sigterm_runs_the_cleanup_that_stops_started_workers():
    script = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC})
    child = int(script.stdout.readline())
    assert alive(child)
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=30) == 128 + signal.SIGTERM
    await wait_until(lambda: not alive(child), timeout=10, message="the script's child survived SIGTERM")


async def test_mock_worker_serves_at_its_address_and_stops_with_nothing_left_in_its_group():
    async with WorkerProcess(["--engine", "mock", "--mock-tokens-per-s", "1000"]) as worker:
        await worker.wait_serving(timeout=120)
        assert worker.address == f"127.0.0.1:{worker.port}"
        request = build_request("helper-1", [GenerateInput(text="hello")], SamplingParams(max_tokens=4))
        async with WorkerClient(worker.address) as client:
            tokens = [t async for chunk in client.generate(request, timeout=30) for t in chunk.token_ids]
        assert len(tokens) == 4
        pid = worker.pid
    assert worker.returncode == 0  # SIGTERM drained it; it exited on its own
    await wait_until(lambda: group_members(pid) == [], timeout=10, message="the worker's group to be empty")


@pytest.mark.parametrize("stop", ["sync", "async"])
async def test_stop_kills_what_outlives_the_process_itself(stop: str):
    """vLLM's engine core survives its killed parent; stopping must sweep the whole group."""
    process = ServiceProcess([sys.executable, "-c", PARENT_WITH_STUBBORN_CHILD], name="stand-in")
    process.start()
    try:
        await wait_until(lambda: "child up" in process.log_tail(), timeout=30, message="the stand-in's child")
        assert len(group_members(process.pid)) == 2
    finally:
        if stop == "sync":
            process.stop(grace_s=5)
        else:
            await process.astop(grace_s=5)
    await wait_until(lambda: group_members(process.pid) == [], timeout=10, message="the group to be empty")


async def test_worker_that_exits_while_starting_raises_with_its_log_tail():
    worker = WorkerProcess(["--engine", "mock", "--no-such-option"]).start()
    try:
        with pytest.raises(ProcessStartError) as raised:
            await worker.wait_serving(timeout=120)
    finally:
        worker.stop(grace_s=5)
    assert raised.value.returncode == 2  # argparse's exit code
    assert "--no-such-option" in raised.value.log_tail
    assert "--no-such-option" in str(raised.value) and str(worker.log_path) in str(raised.value)


async def test_worker_that_never_serves_raises_and_is_still_running():
    hung = WorkerProcess(command=[sys.executable, "-c", "print('loading forever', flush=True); "
                                  "import time; time.sleep(600)"]).start()
    try:
        with pytest.raises(ProcessStartError) as raised:
            await hung.wait_serving(timeout=1)
        assert raised.value.returncode is None
        assert "loading forever" in raised.value.log_tail
        assert hung.running
    finally:
        await hung.astop(grace_s=5)
    assert not hung.running


async def test_gateway_process_is_ready_in_front_of_its_worker_and_stops():
    async with WorkerProcess(["--engine", "mock", "--served-model-name", "helper"]) as worker:
        await worker.wait_serving(timeout=120)
        async with GatewayProcess(["--workers", worker.address, "--no-access-log"]) as gateway:
            await gateway.wait_ready(timeout=60)
            async with httpx.AsyncClient(base_url=gateway.url) as http:
                models = (await http.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["helper"]
            pid = gateway.pid
        assert gateway.returncode is not None
        await wait_until(lambda: group_members(pid) == [], timeout=10, message="the gateway's group to be empty")
