"""No function of the router is over 60 lines (STYLE.md: functions under ~60; issue #51), so
each reads on one screen. A loop that grows a new concern plugs it in as an attempt hook
(router/attempt_hooks.py) instead of lengthening RoutedStream._run."""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_fleet.router

ROUTER = Path(vllm_fleet.router.__file__).parent
MAX_LINES = 60


def _long_functions(root: Path, limit: int) -> list[str]:
    """Every function (method, nested function) under `root` longer than `limit` lines, decorators
    not counted, with its length."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_router_function_is_over_60_lines():
    assert not _long_functions(ROUTER, MAX_LINES), "split these into named steps: " + ", ".join(
        _long_functions(ROUTER, MAX_LINES))


def test_the_check_catches_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}")
    assert _long_functions(tmp_path, MAX_LINES) == [f"{tmp_path.name}/long.py:5 long ({MAX_LINES + 1} lines)"]
