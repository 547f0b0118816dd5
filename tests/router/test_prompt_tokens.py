"""The router's prompt token ids: equal to the worker's own rendering (vLLM's renderer in
process, through the worker's request path), never waited for, and built only from allowed
tokenizer files. benchmarks/tokenize_agreement.py measures the same agreement on 354 requests."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from model_files import CHAT_TEMPLATE_FILE, copy_tokenizer_files, default_model_folder, worker_renderer
from vllm_fleet.errors import TokenizerFilesError
from vllm_fleet.protocol.tokenizer_files import FileAssembler, is_allowed
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer, TokenizerCache
from vllm_fleet.worker.tokenizer_files import read_tokenizer_files

# A tool-use ChatML template that loops over content parts ("openai" content format) and prints
# tools and tool calls as JSON: what the default model's plain template never exercises.
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}
{%- for tc in message.tool_calls or [] %}
<tool_call>{{ tc.function | tojson }}</tool_call>{% endfor %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think></think>
{% endif %}{% endif %}"""

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Météo",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "北京"}'}}

CASES = {
    "system, turns, non-ASCII": {"body": {}, "messages": [
        {"role": "system", "content": "Réponds brièvement. 你好"},
        {"role": "user", "content": "Was ist 😀 + 🚀? naïve"},
        {"role": "assistant", "content": "Ein Gesicht und eine Rakete."},
        {"role": "user", "content": "<|im_start|> inside text"}]},
    "tools and a tool call in history": {"body": {"tools": [WEATHER]}, "messages": [
        {"role": "user", "content": "Wetter in Peking?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "晴 ☀️"}, {"type": "text", "text": "21°C"}]}]},
    "text parts and a developer message": {"body": {}, "messages": [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "ça deux"}]}]},
    "template arguments": {"body": {"chat_template_kwargs": {"enable_thinking": False}}, "messages": [
        {"role": "user", "content": "Hi"}]},
    "completion text": {"body": {}, "prompt": "Once upon a time in Zürich, 東京 🚀"},
    "completion without special tokens": {"body": {"add_special_tokens": False}, "prompt": "  spaced\n\nout"},
}


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory) -> dict[str, Path]:
    """The default model's folder, and a copy of its tokenizer with the tool-use template."""
    tools = copy_tokenizer_files(tmp_path_factory.mktemp("tools-model"), chat_template=False)
    (tools / CHAT_TEMPLATE_FILE).write_text(TOOLS_TEMPLATE)
    return {"default": default_model_folder(), "tools": tools}


async def _worker_ids(renderer, case: dict) -> list[int]:
    from vllm_fleet.worker.openai.request import build_vllm_request

    chat = "messages" in case
    item = GenerateInput(messages=case["messages"]) if chat else GenerateInput(text=case["prompt"])
    body = json.dumps({"model": "m", "max_completion_tokens": 8, **case["body"]}).encode()
    request = GenerateRequest("r", [item], RequestBody("chat" if chat else "completion", body))
    return (await renderer.render(build_vllm_request(request, item))).token_ids


@pytest.fixture(scope="module")
def renderers(model_folders, tmp_path_factory) -> dict[str, tuple[PromptTokenizer, object]]:
    """Per template: the router's tokenizer (from the files TokenizerFiles sends) and the worker's
    renderer (~10 s each: vLLM's config and tokenizer)."""
    return {name: (PromptTokenizer.load(_served(folder, tmp_path_factory.mktemp(f"router-{name}"))),
                   worker_renderer(folder)) for name, folder in model_folders.items()}


@pytest.mark.parametrize("template", ["default", "tools"])
@pytest.mark.parametrize("name", list(CASES))
async def test_router_ids_equal_the_workers(renderers, template, name):
    case = CASES[name]
    if template == "tools" and "messages" not in case:
        pytest.skip("completions use no template")
    router, worker = renderers[template]
    expected = await _worker_ids(worker, case)
    assert router.request_ids(case["body"], messages=case.get("messages"), prompt=case.get("prompt")) == expected


def test_many_threads_tokenize_at_once_without_copying_the_tokenizer(model_folders, monkeypatch):
    """The router tokenizes on a thread pool. Each thread once got its own deepcopy of the
    tokenizer on first use, holding the GIL 110-425 ms mid-traffic (every request on the event
    loop waited); now the threads share one tokenizer, and their ids stay exact."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    tokenizer = PromptTokenizer.load(model_folders["tools"])
    long_text = " ".join(f"clause {i} of the shared contract, ça va" for i in range(300))
    cases = [(c["body"], c.get("messages"), c.get("prompt")) for c in CASES.values()]
    cases += [({}, [{"role": "system", "content": long_text}, {"role": "user", "content": f"q{i}"}], None)
              for i in range(4)] + [({}, None, long_text + f" tail {i}") for i in range(4)]
    expected = [tokenizer.request_ids(b, messages=m, prompt=p) for b, m, p in cases]
    fresh = PromptTokenizer.load(model_folders["tools"])   # piece cache empty: the threads fill it together

    def no_copy(self, memo):
        raise AssertionError("the tokenizer was copied")

    monkeypatch.setattr(type(fresh._tokenizer), "__deepcopy__", no_copy, raising=False)
    start = Barrier(8)

    def run(thread: int) -> list:
        start.wait(timeout=30)
        order = cases[thread % len(cases):] + cases[:thread % len(cases)]
        got = [fresh.request_ids(b, messages=m, prompt=p) for b, m, p in order * 3]
        return [got[(i - thread) % len(cases)] for i in range(len(cases))]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    assert all(result == expected for result in results)


def _served(folder: Path, dest: Path) -> Path:
    """What a router gets from TokenizerFiles for `folder`."""
    files = FileAssembler(dest)
    for chunk in read_tokenizer_files(SimpleNamespace(tokenizer_source=str(folder), tokenizer_revision=None)):
        files.add(*chunk)
    files.finish()
    return dest


class _HeldSource:
    """A worker whose TokenizerFiles answer waits until the test lets it go."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def tokenizer_files(self, dest_dir, *, timeout: float = 60.0) -> list[str]:
        self.calls += 1
        self.asked.set()
        await self.release.wait()
        if self.folder is None:
            raise TokenizerFilesError("this worker's engine has no tokenizer")
        return sorted(p.name for p in _served(self.folder, Path(dest_dir)).iterdir())


async def test_a_tokenizer_not_ready_gives_none_at_once(model_folders, tmp_path):
    cache = TokenizerCache(tmp_path / "cache")
    source = _HeldSource(model_folders["default"])
    body, messages = {}, [{"role": "user", "content": "hello"}]
    task = cache.ensure("smol", source)
    assert task is not None and cache.ensure("smol", source) is task  # one fetch per model
    await source.asked.wait()  # the fetch has started and waits on the worker
    assert cache.ids_for("smol", body, messages=messages) is None  # answered without waiting
    assert not cache.settled("smol")  # a batch router still waits for it
    source.release.set()
    assert await task is not None
    assert cache.settled("smol")
    assert cache.ids_for("smol", body, messages=messages) == cache.get("smol").chat_ids(messages)
    assert cache.ensure("smol", source) is None and source.calls == 1
    # What the router cannot render as the worker would (media) routes without ids too.
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert cache.ids_for("smol", body, messages=image) is None


async def test_a_failed_fetch_gives_none_and_waits_before_trying_again(tmp_path):
    cache = TokenizerCache(tmp_path / "cache", retry_after_s=3600)
    source = _HeldSource(None)
    source.release.set()
    assert await cache.ensure("mock", source) is None
    assert cache.ids_for("mock", {}, prompt="hi") is None
    # A Spark executor's router waiting for the tokenizer stops waiting: retrying takes an hour.
    assert cache.settled("mock")
    assert cache.ensure("mock", source) is None and source.calls == 1


async def test_workers_on_another_vllm_get_ids_for_completions_but_not_for_chat(tmp_path, model_folders):
    # Its chat rendering differs from vLLM 0.32's in places; a completion's tokenization does not.
    cache = TokenizerCache(tmp_path / "cache")
    source = _HeldSource(model_folders["default"])
    source.release.set()
    assert await cache.ensure("smol", source, engine_version="0.26.1") is not None
    tokenizer = cache.get("smol")
    assert cache.ids_for("smol", {}, prompt="hello there") == tokenizer.completion_ids("hello there")
    assert cache.ids_for("smol", {}, prompt=[5, 6, 7]) == [5, 6, 7]
    assert cache.ids_for("smol", {}, messages=[{"role": "user", "content": "hi"}]) is None
    # A model whose workers run the mirrored release keeps its chat ids.
    other = TokenizerCache(tmp_path / "other")
    assert await other.ensure("smol", source, engine_version="0.32.0") is not None
    messages = [{"role": "user", "content": "hi"}]
    assert other.ids_for("smol", {}, messages=messages) == other.get("smol").chat_ids(messages)


@pytest.mark.parametrize("name", ["../tokenizer.json", "{tmp}/tokenizer.json", "sub/tokenizer.json", "..", "",
                                  "model.safetensors", "../../config.json"])
def test_a_name_off_the_allow_list_is_never_written(tmp_path, name):
    name = name.format(tmp=tmp_path)  # an absolute path, kept inside the test's folder
    dest = tmp_path / "router" / "files"
    files = FileAssembler(dest)
    assert not is_allowed(name)
    with pytest.raises(TokenizerFilesError, match="refused tokenizer file"):
        files.add(name, b"evil", True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["router", "router/files"]


def test_a_worker_reads_only_allowed_files(tmp_path, model_folders):
    folder = tmp_path / "model"
    shutil.copytree(model_folders["tools"], folder)
    (folder / "secret.txt").write_text("no")
    (folder / "model.safetensors").write_bytes(b"\0")
    names = {name for name, _, _ in read_tokenizer_files(SimpleNamespace(tokenizer_source=str(folder),
                                                                        tokenizer_revision=None))}
    assert names == {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def test_a_file_cut_short_is_not_kept(tmp_path):
    files = FileAssembler(tmp_path / "dest")
    files.add("tokenizer.json", b"{", False)
    with pytest.raises(TokenizerFilesError, match="cut short"):
        files.finish()
    assert not (tmp_path / "dest" / "tokenizer.json").exists()
