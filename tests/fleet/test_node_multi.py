"""`vllm-fleet node --fleet-file`: two models on this machine's CPU cores, each in its own pool,
started, registered in a real ZooKeeper and routed to by pool; a file that does not fit starts nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.cli import main
from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import NoWorkerError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.registry.zookeeper import ZooKeeperRegistry
from vllm_fleet.router import AdmissionConfig, Router, RouterConfig

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs two CPU cores, one per model")
LONG_MAX_TOKENS = 16


def two_free_ports() -> int:
    """A port whose next port is free too (the node gives its workers consecutive ports)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def fleet_yaml(base_port: int, registry: str | None = None, second_devices: str | None = None) -> str:
    head = f"registry: {registry}\n" if registry else ""
    return head + f"""engine: mock
base_port: {base_port}
models:
  - model: alpha-model
    served_model_name: alpha
    devices: cpu:{CORES[0]}
    pool: short
  - model: beta-model
    served_model_name: beta
    devices: {second_devices or f"cpu:{CORES[1]}"}
    pool: long
"""


@pytest.fixture
def cluster(zookeeper):
    return f"zk://{zookeeper.hosts}/node-multi-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def watcher(cluster):
    registry = ZooKeeperRegistry.from_url(cluster, session_timeout_s=5)
    await registry.start()
    yield registry
    await registry.close()


def test_dry_run_prints_both_models_with_their_pools(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(6100))
    assert main(["node", "--fleet-file", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan for alpha, beta (2 workers" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if "127.0.0.1:61" in line}
    assert sorted((row[1], row[2], row[3]) for row in lines.values()) == [
        ("alpha", "short", "127.0.0.1:6100"), ("beta", "long", "127.0.0.1:6101")]


def test_fleet_file_and_model_are_mutually_exclusive(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(6100))
    assert main(["node", "--fleet-file", str(path), "--model", "x", "--dry-run"]) == 2
    assert "--fleet-file replaces the plan options; move --model" in capsys.readouterr().err


def test_a_fleet_file_that_does_not_fit_starts_nothing(tmp_path, capsys, cluster):
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(two_free_ports(), cluster, second_devices=f"cpu:{CORES[0]}"))  # alpha's core too
    logs = tmp_path / "logs"
    assert main(["node", "--fleet-file", str(path), "--log-dir", str(logs)]) == 2
    err = capsys.readouterr().err
    assert "nothing was started" in err and f"models[1] (beta): cores {CORES[0]} are also given to models[0]" in err
    assert not logs.exists() or not any(logs.iterdir())  # no worker was spawned (each writes its log)


async def routed_worker(router: Router, model: str, max_tokens: int) -> str:
    request = build_request(f"r-{uuid.uuid4().hex[:6]}", [GenerateInput(text="hello")],
                            SamplingParams(max_tokens=max_tokens))
    stream = router.stream(request, model=model)
    [chunk async for chunk in stream]
    return stream.worker


async def test_two_models_start_register_with_their_pools_and_route_by_class(tmp_path, cluster, watcher):
    base = two_free_ports()
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(base, cluster))
    node = subprocess.Popen(
        [sys.executable, "-m", "vllm_fleet.cli", "node", "--fleet-file", str(path), "--log-dir", str(tmp_path),
         "--health-interval-s", "0.2", "--stop-grace-s", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    alpha, beta = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    router = Router(watcher, RouterConfig(health_poll_interval_s=0.2, load_poll_interval_s=0.2,
                                          admission=AdmissionConfig(class_pools=True, long_max_tokens=LONG_MAX_TOKENS)),
                    own_registry=False, metrics_registry=CollectorRegistry())
    try:
        await wait_until(lambda: {alpha, beta} <= set(watcher.members()), timeout=60, message="both registered")
        records = watcher.members()
        assert (records[alpha].model, records[alpha].pool) == ("alpha", "short")
        assert (records[beta].model, records[beta].pool) == ("beta", "long")
        async with WorkerClient(beta) as client:
            info = await client.info()
        assert (info.model, info.pool, info.device) == ("beta", "long", f"cpu {CORES[1]}")

        await router.start()
        await wait_until(lambda: len(router.snapshot().eligible()) == 2, timeout=30, message="router sees both")
        assert await routed_worker(router, "alpha", 3) == alpha
        assert await routed_worker(router, "beta", LONG_MAX_TOKENS) == beta
        with pytest.raises(NoWorkerError):  # a long alpha request: the long pool has no alpha worker
            await routed_worker(router, "alpha", LONG_MAX_TOKENS)
    finally:
        await router.close()
        os.kill(node.pid, signal.SIGTERM)
        await asyncio.get_running_loop().run_in_executor(None, node.wait, 30)
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
    assert node.returncode == 0
    await wait_until(lambda: not {alpha, beta} & set(watcher.members()), timeout=15, message="deregistered on stop")
