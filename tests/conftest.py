"""Shared fixtures: mock workers on demand, real vLLM workers shared by the whole session, and a
copy of the default model's tokenizer files per test module.

Real workers are expensive (~30 s, ~3 GB each), so at most two exist, each bound to its own
core, started the first time a test asks for one (the second beside the first when the session
will ask for both) and stopped at the end of the session. Mock workers that a test needs
together start together (`MockWorkers.start_many`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from model_files import copy_tokenizer_files
from support import FORKS, WorkerProcess, vllm_worker_args, worker_env

VLLM_START_TIMEOUT_S = 600.0
# scripts/test.sh names a file here; each test's id is written to it as the test starts, so a run
# that ends without a report for a test (an INTERNALERROR, a kill) still says where it was.
PROGRESS_FILE_ENV = "VLLM_FLEET_TEST_PROGRESS"


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    path = os.environ.get(PROGRESS_FILE_ENV)
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER")  # one file per xdist process: each says where it was
        with open(f"{path}.{worker}" if worker else path, "w") as out:
            out.write(nodeid + "\n")


_MOCK_FIXTURES = ("mock_worker_factory", "module_mock_workers", "session_mock_workers")
_ENGINE_FIXTURES = frozenset({"vllm_worker", "vllm_worker_b", "vllm_pooling_worker"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (scripts/test.sh runs three processes: much of the suite waits on
    # processes, sockets and deadlines, not on a core), what is heavy to start exists once: every
    # test that needs a real engine runs in the one process that holds the session's engines (and
    # starts its own engines there, one at a time, not beside another process's), every Spark
    # test in the one that holds the JVM; any other module stays whole, so its module fixtures
    # start once.
    #
    # The longest groups go first (scripts/test.sh turns off xdist's reordering by test count):
    # a run ends when its last group does, and a few chaos tests of a minute each, started last,
    # left one process working alone.
    if not getattr(config.option, "loadgroup", False):  # what xdist sets in its processes for --dist loadgroup
        return
    groups = {item: _group_of(item) for item in items}
    items.sort(key=lambda item: _long_groups_first(groups[item]))  # stable: a module keeps its order
    for item in items:
        _join_group(item, groups[item])


def _group_of(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    if names & _ENGINE_FIXTURES or item.get_closest_marker("engine"):
        return "real-engines"
    if "spark" in names:
        return "spark"
    return item.nodeid.split("::", 1)[0]


def _long_groups_first(group: str) -> int:
    for rank, start in enumerate(("real-engines", "spark", "tests/chaos/", "tests/spark/", "tests/fleet/")):
        if group.startswith(start):
            return rank
    return 5


def _join_group(item: pytest.Item, group: str) -> None:
    # --dist loadgroup schedules by the "@group" suffix of a test's id. xdist 3.8 adds it from
    # xdist_group marks in a hook pytest 9 never calls (an undecorated method), and pytest 9 keeps
    # the id structured (`_id`), so the suffix is set here; if a pytest release moves it again,
    # the run stops with a message instead of starting every engine in every process.
    grouped = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(grouped)
    else:
        item._nodeid = grouped
    if item.nodeid != grouped:
        raise pytest.UsageError("this pytest cannot group tests for pytest-xdist; run the suite with -n 0 "
                                "(VLLM_FLEET_TEST_PROCESSES=0 bash scripts/test.sh)")


def pytest_collection_finish(session: pytest.Session) -> None:
    # The fork server's imports (~9 s of CPU) overlap the first tests instead of delaying the
    # first mock worker; a session that starts none never pays them.
    if any(name in getattr(item, "fixturenames", ()) for item in session.items for name in _MOCK_FIXTURES):
        FORKS.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    FORKS.close()


class MockWorkers:
    """`start(**options)` → a running mock worker (WorkerProcess). Options are worker/engine CLI
    options with underscores, e.g. start(mock_tokens_per_s=500, mock_ttft_ms=5, max_num_seqs=8)."""

    def __init__(self) -> None:
        self.started: list[WorkerProcess] = []

    async def start(self, *, timeout: float = 120.0, **options) -> WorkerProcess:
        args = ["--engine", "mock"]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False and value is not None:
                args += [flag, str(value)]
        worker = WorkerProcess(args, worker_env()).start()
        self.started.append(worker)
        await worker.wait_serving(timeout)
        return worker

    async def start_many(self, count: int, *, timeout: float = 120.0, **options) -> list[WorkerProcess]:
        """`count` mock workers of the same options, started at once (forks of the fork server,
        support.FORKS: each serves in about a second; they still initialise side by side)."""
        return list(await asyncio.gather(*(self.start(timeout=timeout, **options) for _ in range(count))))

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop(timeout=10)
        self.started.clear()


# Each mock worker lives only as long as the scope that asked for it: when each imported vLLM on
# its own (~650 MB resident), forty kept for a whole session pushed a 24 GB machine into reclaim
# and its workers past their start deadline. Forks share the fork server's pages until written.
@pytest.fixture
def mock_worker_factory():
    """Mock workers stopped when the test ends."""
    workers = MockWorkers()
    yield workers
    workers.stop_all()


@pytest.fixture(scope="module")
def module_mock_workers():
    """Mock workers for a module-scoped fixture, stopped when the module ends."""
    workers = MockWorkers()
    yield workers
    workers.stop_all()


@pytest.fixture(scope="session")
def session_mock_workers():
    """Mock workers for a session-scoped fixture (a fleet many modules share)."""
    workers = MockWorkers()
    yield workers
    workers.stop_all()


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """A folder of the default model's tokenizer files and chat template (model_files.py): a mock
    engine's `mock_tokenizer`, or the files a worker sends a router."""
    return copy_tokenizer_files(tmp_path_factory.mktemp("tokenizer"))


def _start_vllm(cores: str) -> WorkerProcess:
    # KV-cache events on (vLLM's default here is off): the cache-routing and KvEvents tests share these engines.
    args, env = vllm_worker_args(cores, "--kv-events")
    return WorkerProcess(args, env).start()


# The second shared worker, started beside the first when the session will ask for both: each
# engine starts on its own core, so the pair serves in ~30 s instead of ~60 s one after the other.
_started_ahead: dict[str, WorkerProcess] = {}


def _session_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
async def vllm_worker(request):
    """A real vLLM worker (default model) on core 0, shared by the session."""
    worker = _start_vllm("0")
    if _session_uses(request, "vllm_worker_b"):
        _started_ahead["1"] = _start_vllm("1")
    try:
        await worker.wait_serving(VLLM_START_TIMEOUT_S)
        yield worker
    finally:
        worker.stop()
        unused = _started_ahead.pop("1", None)  # the session ended before a test asked for it
        if unused is not None:
            unused.stop()


@pytest.fixture(scope="session")
async def vllm_worker_b():
    """A second real vLLM worker on core 1 (for routing and failover tests)."""
    worker = _started_ahead.pop("1", None) or _start_vllm("1")
    try:
        await worker.wait_serving(VLLM_START_TIMEOUT_S)
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole test session (Spark and chaos tests share it)."""
    # Executors must run this interpreter (it has pyarrow and vllm_fleet), set before the JVM starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown INFO lines outlive pytest's streams
    session = (
        SparkSession.builder.master("local[2]")
        .appName("vllm-fleet-tests")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
async def vllm_pooling_worker():
    """A real vLLM worker with the packaged embedding model (all-MiniLM-L6-v2, 22M parameters:
    ~1 GB, starts in ~25 s), shared by every pooling test of the session."""
    args, env = vllm_worker_args("1", "--model", "all-minilm-l6-v2", "--max-model-len", "256")
    worker = WorkerProcess(args, env).start()
    try:
        await worker.wait_serving(VLLM_START_TIMEOUT_S)
        yield worker
    finally:
        worker.stop()

