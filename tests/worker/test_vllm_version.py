"""The worker runs only on the vLLM releases it supports (#28): others are refused at start with
a message naming the installed version and the supported range."""

from __future__ import annotations

import os

import pytest

from support import WorkerProcess, vllm_worker_args
from vllm_fleet.errors import ConfigError, ProcessStartError
from vllm_fleet.worker.engines.vllm_version import check_vllm_version

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("version", ["0.26.0", "0.26.2", "0.32.0", "0.32.0+cpu", "0.32.1.dev3+g1234abc"])
def test_the_tested_releases_and_those_between_are_accepted(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.22.0", "0.25.1", "0.33.0", "0.33.0rc1", "1.0.0"])
def test_other_releases_are_refused_naming_the_version_and_the_range(version):
    with pytest.raises(ConfigError) as refused:
        check_vllm_version(version)
    assert f"vLLM {version} is installed" in str(refused.value)
    assert ">=0.26,<0.33" in str(refused.value)


def test_a_version_that_is_not_a_number_is_refused():
    with pytest.raises(ConfigError, match="'unknown'"):
        check_vllm_version("unknown")


async def test_a_worker_on_an_unsupported_vllm_exits_at_start_saying_why(tmp_path):
    # The installed vLLM, reporting itself as 0.22: refused before any engine is built.
    (tmp_path / "sitecustomize.py").write_text("import vllm\nvllm.__version__ = '0.22.0'\n")
    args, env = vllm_worker_args("0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    worker = WorkerProcess(args, env).start()
    try:
        with pytest.raises(ProcessStartError) as failed:
            await worker.wait_serving(240)
    finally:
        worker.stop(timeout=10)
    assert "vLLM 0.22.0 is installed" in str(failed.value)
    assert ">=0.26,<0.33" in str(failed.value)
