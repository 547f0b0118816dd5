"""The node supervisor with real mock-engine worker processes and a real ZooKeeper."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from support import free_port, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.fleet.config import PlanConfig, SupervisorConfig
from vllm_fleet.fleet.gpus import Device, Inventory
from vllm_fleet.fleet.plan import Plan, WorkerSpec, build_plan
from vllm_fleet.fleet.supervisor import NodeSupervisor
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.registry.zookeeper import ZooKeeperRegistry
from vllm_fleet.router import Router, RouterConfig

FAST = SupervisorConfig(backoff_initial_s=0.2, backoff_max_s=1.0, health_interval_s=0.2, stop_grace_s=5,
                        startup_timeout_s=60)


def mock_plan(workers: int) -> Plan:
    cpu = Device(kind="cpu", name="cpu", memory_bytes=8 << 30, cores=tuple(range(workers)))
    plan = build_plan(Inventory(source="test", cpu=cpu), PlanConfig(engine="mock", cpu_workers=workers))
    for spec in plan.workers:  # consecutive ports may be taken on a shared machine
        spec.port = free_port()
    return plan


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
async def registries(zookeeper):
    name = f"node-{uuid.uuid4().hex[:8]}"
    node = ZooKeeperRegistry(zookeeper.hosts, name, session_timeout_s=5)
    watcher = ZooKeeperRegistry(zookeeper.hosts, name, session_timeout_s=5)
    await node.start()
    await watcher.start()
    yield node, watcher
    await node.close()
    await watcher.close()


async def routed_text(router: Router, prompt: str) -> str:
    request = build_request(f"r-{uuid.uuid4().hex[:6]}", [GenerateInput(text=prompt)], SamplingParams(max_tokens=8))
    return "".join([chunk.text async for chunk in router.stream(request)])


async def test_worker_killed_with_sigkill_is_restarted_reregistered_and_routed_to(registries):
    node, watcher = registries
    history: list[set[str]] = []
    watcher.subscribe(lambda members: history.append(set(members)))
    supervisor = NodeSupervisor(mock_plan(1), node, FAST)
    router = Router(watcher, RouterConfig(health_poll_interval_s=0.2, load_poll_interval_s=0.2), own_registry=False,
                    metrics_registry=CollectorRegistry())
    await supervisor.start()
    try:
        await supervisor.wait_serving(timeout=120)
        worker = supervisor.workers[0]
        address = worker.spec.address
        await wait_until(lambda: address in watcher.members(), timeout=10, message="registered")
        assert watcher.members()[address].device == "cpu 0"
        await router.start()
        await router.wait_ready(timeout=30)
        assert await routed_text(router, "before")

        old_pid = worker.pid
        os.killpg(old_pid, signal.SIGKILL)
        seen_from = len(history)
        await wait_until(lambda: any(address not in members for members in history[seen_from:]), timeout=10,
                         message="crashed worker deregistered")
        await wait_until(lambda: worker.state == "serving" and worker.pid != old_pid, timeout=60,
                         message="worker restarted")
        await wait_until(lambda: address in watcher.members(), timeout=10, message="re-registered")
        await wait_until(lambda: address in {v.address for v in router.snapshot().eligible()}, timeout=30,
                         message="router sees it serving again")
        assert await routed_text(router, "after")
        assert len(worker.restarts) == 1
    finally:
        await router.close()
        await supervisor.stop()
    assert not alive(old_pid)
    await wait_until(lambda: address not in watcher.members(), timeout=10, message="deregistered on stop")


@dataclass
class CrashingSpec(WorkerSpec):
    """A worker whose process exits at once, as one with a broken install would."""

    def argv(self, python: str = sys.executable) -> list[str]:
        return [python, "-c", "import sys; sys.exit(3)"]


async def test_flapping_worker_is_given_up_and_never_registered(registries):
    node, watcher = registries
    plan = mock_plan(1)
    spec = plan.workers[0]
    plan.workers[0] = CrashingSpec(worker_id=spec.worker_id, device=spec.device, port=spec.port, host=spec.host,
                                   engine=spec.engine)
    config = FAST.model_copy(update={"max_restarts": 3, "backoff_initial_s": 0.05})
    supervisor = NodeSupervisor(plan, node, config)
    await supervisor.start()
    try:
        worker = supervisor.workers[0]
        await wait_until(lambda: worker.state == "failed", timeout=30, message="flapping worker given up")
        assert len(worker.restarts) == 3
        assert worker.process.returncode == 3
        assert watcher.members() == {}
    finally:
        await supervisor.stop()


async def test_stop_drains_every_worker():
    supervisor = NodeSupervisor(mock_plan(2), None, FAST)
    await supervisor.start()
    await supervisor.wait_serving(timeout=120)
    pids = [w.pid for w in supervisor.workers]
    await supervisor.stop()
    assert not any(alive(pid) for pid in pids)
    assert all(w.state == "stopped" or w.process.returncode is not None for w in supervisor.workers)


async def _node_process(port: int) -> subprocess.Popen:
    node = subprocess.Popen(
        [sys.executable, "-m", "vllm_fleet.cli", "node", "--engine", "mock", "--cpu-workers", "1",
         "--base-port", str(port), "--stop-grace-s", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    async with WorkerClient(f"127.0.0.1:{port}") as client:
        await client.wait_serving(timeout=120)
    return node


async def _unreachable(port: int) -> bool:
    async with WorkerClient(f"127.0.0.1:{port}") as client:
        return await client.health(timeout=1) == "UNREACHABLE"


@pytest.mark.parametrize("sig, expected_exit", [(signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)])
async def test_node_leaves_no_worker_behind(sig, expected_exit):
    """SIGTERM drains; even a SIGKILLed supervisor takes its workers down (PR_SET_PDEATHSIG)."""
    port = free_port()
    node = await _node_process(port)
    try:
        os.kill(node.pid, sig)
        await asyncio.get_running_loop().run_in_executor(None, node.wait, 30)
        assert node.returncode == expected_exit
        await wait_until(lambda: _unreachable(port), timeout=15, message="worker gone with its supervisor")
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


async def test_worker_alive_but_not_serving_past_the_grace_is_restarted():
    """A hung worker (its process stopped: alive, health unanswered) never recovers by itself."""
    config = FAST.model_copy(update={"not_serving_grace_s": 1.0})
    supervisor = NodeSupervisor(mock_plan(1), None, config)
    await supervisor.start()
    try:
        await supervisor.wait_serving(timeout=120)
        worker = supervisor.workers[0]
        hung_pid = worker.pid
        os.kill(hung_pid, signal.SIGSTOP)
        await wait_until(lambda: worker.pid != hung_pid and worker.state == "serving", timeout=60,
                         message="the hung worker replaced by a serving one")
        assert not alive(hung_pid)
        assert len(worker.restarts) == 1
        async with WorkerClient(worker.spec.address) as client:
            assert await client.health(timeout=2) == "SERVING"
    finally:
        await supervisor.stop()


async def test_worker_not_serving_for_less_than_the_grace_keeps_running():
    config = FAST.model_copy(update={"not_serving_grace_s": 30.0})
    supervisor = NodeSupervisor(mock_plan(1), None, config)
    await supervisor.start()
    try:
        await supervisor.wait_serving(timeout=120)
        worker = supervisor.workers[0]
        pid = worker.pid
        os.kill(pid, signal.SIGSTOP)
        await wait_until(lambda: worker.state == "unhealthy", timeout=30, message="seen as not serving")
        os.kill(pid, signal.SIGCONT)
        await wait_until(lambda: worker.state == "serving", timeout=30, message="serving again")
        assert worker.pid == pid and not worker.restarts
    finally:
        await supervisor.stop()


async def test_workers_sharing_one_gpu_start_one_after_another():
    # vLLM sizes its KV cache from what its start-up profiling sees used on the GPU, so two
    # engines starting at once on one GPU miscount each other; a worker with a GPU of its own
    # does not wait.
    plan = mock_plan(3)
    first, second, alone = plan.workers
    first.env = {**first.env, "CUDA_VISIBLE_DEVICES": "GPU-shared"}
    second.env = {**second.env, "CUDA_VISIBLE_DEVICES": "GPU-shared"}
    alone.env = {**alone.env, "CUDA_VISIBLE_DEVICES": "GPU-own"}
    supervisor = NodeSupervisor(plan, None, FAST)
    await supervisor.start()
    try:
        await supervisor.wait_serving(timeout=180)  # two plain worker starts one after another, on a loaded machine
        one, two, three = supervisor.workers
        assert two.spawned_at >= one.serving_since, "the second sharer started before the first was serving"
        assert three.spawned_at < one.serving_since, "a worker on its own GPU waited for another GPU's"
    finally:
        await supervisor.stop()
