"""docs/life-of-a-request.md stays true: every function, class, method and file it names in
backticks exists in src/vllm_fleet. Names are found by grep, not by import: a `Class.member` is
a `class Class` and, in the same file, a `def member` or a `member:`/`self.member =` attribute; a
`module.name` (`forward.engine_body`, `openai/request.build_vllm_request`) is a file or package
ending in that module path that defines `name`; a `path.py` is a file under src/vllm_fleet.

The page also counts what issue #25 changed, naming in its "before" columns what that change
removed. Those names are listed in HISTORICAL, and each is checked to be gone (and still named by
the page), so the list cannot hide a name that drifted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vllm_fleet"
DOC = ROOT / "docs" / "life-of-a-request.md"

# Named in the "before" columns of the page's counts: removed by the change it measures.
HISTORICAL = {
    "GenerateRequest.grammar_constrained",  # now GenerateRequest.constrained
    "convert.params_to_pb",                 # the protobuf SamplingParams copy
    "convert.params_from_pb",
    "forward.fill_extras",
    "forward.is_constrained",               # now protocol/sampling.is_constrained
    "openai_request.request_body",          # now openai/request.request_fields
    "openai_request.message_dict",
    "validation.check_values",
    "vllm_prompt._openai",
    "worker/vllm_prompt.py",
    "worker/sampling.py",
    "worker/sampling.vllm_sampling_params",
    "worker/mock_engine.py",                # now worker/engines/mock_engine.py
}
# Not modules of ours: the standard library, and a request's fields named in prose.
NOT_MODULES = {"json", "asyncio", "body", "params"}
# vLLM's classes and files, named where the path enters it.
VLLM_CLASSES = {"AsyncLLM"}

CLASS_MEMBER = re.compile(r"^([A-Z]\w*)\.(\w+)$")
MODULE_MEMBER = re.compile(r"^((?:[a-z_]\w*/)*[a-z_]\w*)\.(\w+)$")
PATH = re.compile(r"^[\w/]+\.py$")

SOURCES = {path.relative_to(SRC).as_posix(): path.read_text() for path in sorted(SRC.rglob("*.py"))}


def named() -> list[str]:
    """Every backticked span of the page that names a path, a Class.member or a module.name."""
    spans = sorted(set(re.findall(r"`([^`\n]+)`", DOC.read_text())))
    return [s for s in spans if PATH.match(s) or CLASS_MEMBER.match(s) or MODULE_MEMBER.match(s)]


def defines(text: str, name: str) -> bool:
    """A def or class of that name, or an attribute (a field, or one set on `self`)."""
    name = re.escape(name)
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*(?:self\.)?{name}\s*[:=]", text,
                     re.MULTILINE) is not None


def problem(name: str) -> str | None:
    """Why `name` does not resolve in src/vllm_fleet; None when it does (or is not ours)."""
    if PATH.match(name):
        if name.startswith("vllm/"):
            return None
        found = [p for p in SOURCES if p == name or p.endswith("/" + name)]
        return None if found else "no such file"
    if match := CLASS_MEMBER.match(name):
        cls, member = match.groups()
        homes = [text for text in SOURCES.values() if re.search(rf"^\s*class {cls}\b", text, re.MULTILINE)]
        if not homes:
            return None if cls in VLLM_CLASSES else f"no class {cls}"
        return None if any(defines(text, member) for text in homes) else f"class {cls} has no {member}"
    module, member = MODULE_MEMBER.match(name).groups()
    homes = [text for path, text in SOURCES.items()
             if re.search(rf"(^|/){re.escape(module)}(\.py|/.*\.py)$", path)]
    if not homes:
        return None if module in NOT_MODULES else f"no module {module}"
    return None if any(defines(text, member) for text in homes) else f"{module} defines no {member}"


@pytest.mark.parametrize("name", [n for n in named() if n not in HISTORICAL])
def test_each_name_the_page_gives_exists(name):
    assert problem(name) is None, f"docs/life-of-a-request.md names `{name}`: {problem(name)}"


@pytest.mark.parametrize("name", sorted(HISTORICAL))
def test_each_name_kept_as_history_is_gone_and_still_on_the_page(name):
    assert name in named(), "no longer on the page: drop it from HISTORICAL"
    assert problem(name) is not None, "it exists: the page names it as current, drop it from HISTORICAL"


def test_the_page_is_read():
    assert len(named()) > 50  # a change of format that hides the names fails here, not silently
