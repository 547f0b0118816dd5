"""Workers that live as long as a Spark application: one per executor, registered in ZooKeeper.

    handle = start_spark_workers(spark, registry="zk://zk1:2181/batch", num_workers=4,
                                 engine=EngineConfig(model="Qwen/Qwen3.5-9B"))
    handle.wait_registered(timeout=600)          # the Spark driver's router now sees them
    ... df = vllm_fleet.spark.generate(df, registry=handle.registry, ...) ...
    handle.stop()

A barrier stage of `num_workers` tasks runs on a background thread of the driver; barrier
mode launches all tasks together, one per task slot, so with one slot per executor
(`spark.executor.cores` = `spark.task.cpus`) each executor gets exactly one worker. Each task
runs a supervised worker (restart with backoff, as `vllm-fleet node` does) bound to the GPUs
Spark assigned to it (`TaskContext.resources()["gpu"]`), registers it, and serves until the
driver sets the job's stop flag in ZooKeeper; then it drains, deregisters and returns.
If the application dies instead, the worker dies with its Python task (PR_SET_PDEATHSIG)
and its ephemeral node with the task's ZooKeeper session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError
from vllm_fleet.fleet.config import SupervisorConfig

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.5


@dataclass
class SparkWorkers:
    """Handle to the workers of one Spark job (see `start_spark_workers`)."""

    registry: str                        # zk:// URL the workers registered in
    job_id: str
    num_workers: int
    _stop_flag: Callable[[], None]
    _thread: threading.Thread
    _outcome: dict = field(default_factory=dict)

    def addresses(self, timeout: float = 10.0) -> list[str]:
        """Addresses currently registered under this job's worker ids."""
        members = _read_members(self.registry, timeout)
        return sorted(a for a, r in members.items() if r.worker_id.startswith(self.job_id))

    def wait_registered(self, timeout: float) -> list[str]:
        """Until all `num_workers` are registered; raises TimeoutError (or the job's error)."""
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            found = self.addresses()
            if len(found) >= self.num_workers:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {self.num_workers} Spark workers registered after {timeout:.0f}s")
            time.sleep(STOP_POLL_S)

    def stop(self, timeout: float = 120.0) -> None:
        """Drain every worker and end the Spark job."""
        self._stop_flag()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"Spark worker job {self.job_id} did not end within {timeout:.0f}s")
        _clear_job(self.registry, self.job_id)

    def result(self) -> list[str]:
        """The address each task's worker served on, once the job ended (after `stop`);
        raises RuntimeError if the job failed or is still running."""
        self._raise_if_failed()
        if "result" not in self._outcome:
            raise RuntimeError(f"Spark worker job {self.job_id} is still running: call stop() first")
        return list(self._outcome["result"])

    def _raise_if_failed(self) -> None:
        if "error" in self._outcome:
            raise RuntimeError(f"Spark worker job failed: {self._outcome['error']}")


def start_spark_workers(spark, *, registry: str, num_workers: int, engine: EngineConfig,
                        supervisor: SupervisorConfig | None = None,
                        engine_for: Callable[[int], EngineConfig] | None = None) -> SparkWorkers:
    """Start one worker per Spark task slot in a barrier job; returns at once (see `wait_registered`).

    `engine_for(partition)` may give each worker its own settings (e.g. CPU cores in local mode).
    """
    if not registry.startswith("zk://"):
        raise ConfigError("Spark workers register in ZooKeeper: pass registry='zk://host:port/cluster'")
    if num_workers < 1:
        raise ConfigError("num_workers must be at least 1")
    job_id = f"spark-{uuid.uuid4().hex[:8]}"
    supervisor = supervisor or SupervisorConfig()
    outcome: dict = {}
    task = _task_function(registry, job_id, engine, supervisor, engine_for)

    def run_job() -> None:
        sc = spark.sparkContext
        sc.setJobGroup(job_id, f"vllm-fleet workers {job_id}", interruptOnCancel=True)
        try:
            outcome["result"] = sc.parallelize(range(num_workers), num_workers).barrier().mapPartitions(task).collect()
        except Exception as exc:  # reported through the handle
            outcome["error"] = exc
            logger.error("Spark worker job %s failed: %s", job_id, exc)

    thread = threading.Thread(target=run_job, name=f"vllm-fleet-{job_id}", daemon=True)
    thread.start()
    return SparkWorkers(registry=registry, job_id=job_id, num_workers=num_workers,
                        _stop_flag=lambda: _set_stop_flag(registry, job_id), _thread=thread, _outcome=outcome)


def _task_function(registry: str, job_id: str, engine: EngineConfig, supervisor: SupervisorConfig,
                   engine_for: Callable[[int], EngineConfig] | None):
    """The barrier task (pickled to executors): serve one worker until the stop flag is set."""
    def task(partition):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        index = context.partitionId()
        gpus = context.resources().get("gpu")
        config = engine_for(index) if engine_for else engine
        env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus.addresses)} if gpus else {}
        address = asyncio.run(_serve(registry, job_id, index, config, env, supervisor))
        yield address
    return task


async def _serve(registry_url: str, job_id: str, index: int, engine: EngineConfig, env: dict[str, str],
                 config: SupervisorConfig) -> str:
    from vllm_fleet.fleet.plan import WorkerSpec
    from vllm_fleet.fleet.supervisor import ManagedWorker
    from vllm_fleet.registry.zookeeper import ZooKeeperRegistry

    registry = ZooKeeperRegistry.from_url(registry_url)
    await registry.start()
    host = _executor_host()
    spec = WorkerSpec(worker_id=f"{job_id}-{index}", device=_device_label(env, engine), port=_free_port(host),
                      host=host, engine=engine, env=env)
    worker = ManagedWorker(spec, registry, config, Path(config.log_dir or tempfile.gettempdir()))
    running = asyncio.create_task(worker.run())
    try:
        while not running.done() and not await _stop_flag_set(registry, job_id):
            await asyncio.sleep(STOP_POLL_S)
    finally:
        await worker.stop(config.stop_grace_s)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await registry.close()
    return spec.address


def _executor_host() -> str:
    # Local mode serves this machine only; on a cluster the driver reaches executors by name.
    hostname = socket.gethostname()
    try:
        return "127.0.0.1" if socket.gethostbyname(hostname).startswith("127.") else hostname
    except OSError:
        return "127.0.0.1"


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host == "127.0.0.1" else "", 0))
        return sock.getsockname()[1]


def _device_label(env: dict[str, str], engine: EngineConfig) -> str:
    if env.get("CUDA_VISIBLE_DEVICES"):
        return f"GPU {env['CUDA_VISIBLE_DEVICES']} (Spark)"
    return f"cpu {engine.cpu_cores or 'any'} (Spark)"


def _flag_path(base: str, job_id: str) -> str:
    return f"{base}/jobs/{job_id}/stop"


async def _stop_flag_set(registry, job_id: str) -> bool:
    path = _flag_path(registry.base, job_id)
    try:
        return await asyncio.get_running_loop().run_in_executor(None, registry.kazoo.exists, path) is not None
    except Exception:  # ZooKeeper briefly unreachable: keep serving
        return False


def _kazoo(registry_url: str, timeout: float = 15.0):
    from kazoo.client import KazooClient

    from vllm_fleet.registry.zookeeper import ZooKeeperRegistry

    parsed = ZooKeeperRegistry.from_url(registry_url)
    client = KazooClient(hosts=parsed.hosts)
    client.start(timeout=timeout)
    return client, parsed


def _set_stop_flag(registry_url: str, job_id: str) -> None:
    client, parsed = _kazoo(registry_url)
    try:
        client.ensure_path(_flag_path(parsed.base, job_id))
    finally:
        client.stop()
        client.close()


def _clear_job(registry_url: str, job_id: str) -> None:
    client, parsed = _kazoo(registry_url)
    try:
        client.delete(f"{parsed.base}/jobs/{job_id}", recursive=True)
    except Exception as exc:  # best effort: a leftover flag only names a finished job
        logger.debug("could not remove job node %s: %s", job_id, exc)
    finally:
        client.stop()
        client.close()


def _read_members(registry_url: str, timeout: float):
    from vllm_fleet.registry.base import WorkerRecord

    client, parsed = _kazoo(registry_url, timeout)
    try:
        members = {}
        for child in client.get_children(parsed.path) if client.exists(parsed.path) else []:
            data, _ = client.get(f"{parsed.path}/{child}")
            record = WorkerRecord.from_dict(json.loads(data.decode()))
            members[record.address] = record
        return members
    finally:
        client.stop()
        client.close()
