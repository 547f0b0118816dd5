"""The router's module map: every module of the room and of each wing is named in its package's
docstring (router/__init__.py, and each wing's __init__.py), so the map cannot drift from the files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vllm_fleet.router

ROUTER = Path(vllm_fleet.router.__file__).parent


def _unnamed(package: Path) -> list[str]:
    """The modules (and sub-packages) of `package` its __init__ docstring does not name as a word."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    names += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(name for name in names if not re.search(rf"\b{re.escape(name)}\b", doc))


def test_every_router_module_is_named_in_its_packages_map():
    packages = [ROUTER] + sorted(p.parent for p in ROUTER.rglob("*/__init__.py"))
    missing = {str(p.relative_to(ROUTER.parent)): names for p in packages if (names := _unnamed(p))}
    assert not missing, f"modules missing from their package's docstring map: {missing}"


def test_the_check_catches_a_module_left_out(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Modules: listed (one), lister (another)."""\n')
    for name in ("listed", "lister", "forgotten"):
        (tmp_path / f"{name}.py").write_text("")
    assert _unnamed(tmp_path) == ["forgotten"]
