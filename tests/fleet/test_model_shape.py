"""Any Hugging Face id in `plan` and `node`: config.json from a local folder, the HF cache, the hub
or a built-in copy, and a failure that says where it looked. The cache here is a real
huggingface_hub layout (refs → commit → snapshot symlinks into blobs); no test uses the network."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vllm_fleet.cli import main
from vllm_fleet.errors import ModelError
from vllm_fleet.fleet.capacity import kv_bytes_per_token, state_bytes_per_sequence
from vllm_fleet.fleet.model_shape import load_shape

REPO = Path(__file__).resolve().parents[2]
QWEN35_CONFIG = REPO / "benchmarks" / "gpu" / "configs" / "qwen3.5-9b" / "config.json"
MAIN_COMMIT = "a" * 40
V2_COMMIT = "b" * 40
TINY = {  # SmolLM2-135M's published shape: small enough for a CPU plan
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def cache_model(cache: Path, repo_id: str, files: dict[str, str], *, commit: str = MAIN_COMMIT,
                ref: str | None = "main") -> Path:
    """Lay files out the way `hf download` does; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content.encode()).hexdigest()
        blob.write_text(content)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_plan_reads_a_hybrid_multimodal_config_from_the_cache(hf_cache, capsys):
    snapshot = cache_model(hf_cache, "acme/Hybrid-9B", {"config.json": QWEN35_CONFIG.read_text()})
    assert main(["plan", "--model", "acme/Hybrid-9B", "--device", "H200", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "model acme/Hybrid-9B on H200" in out
    assert "KV per token          32.0 KiB" in out and "state per seq         25.1 MiB" in out
    assert f"model config from Hugging Face cache {snapshot}" in out and "built-in" not in out


def test_cached_config_parses_like_the_builtin_copy(hf_cache):
    cache_model(hf_cache, "acme/Hybrid-9B", {"config.json": QWEN35_CONFIG.read_text()})
    cached, builtin = load_shape("acme/Hybrid-9B"), load_shape("Qwen/Qwen3.5-9B")
    assert builtin.from_builtin and not cached.from_builtin
    assert (cached.num_attention_layers, cached.num_linear_layers) == (8, 24)
    assert kv_bytes_per_token(cached) == kv_bytes_per_token(builtin)
    assert state_bytes_per_sequence(cached) == state_bytes_per_sequence(builtin)
    assert cached.parameter_count() == builtin.parameter_count()


def test_weights_come_from_the_cached_safetensors_index(hf_cache, capsys):
    index = json.dumps({"metadata": {"total_size": 5 * 1024**3}, "weight_map": {}})
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps(TINY), "model.safetensors.index.json": index})
    assert load_shape("acme/Tiny").weight_bytes() == 5 * 1024**3
    assert main(["plan", "--model", "acme/Tiny", "--device", "H200"]) == 0
    assert "weights               5.00 GiB" in capsys.readouterr().out


def test_a_cached_reference_model_wins_over_the_builtin_copy(hf_cache):
    cache_model(hf_cache, "Qwen/Qwen3-8B", {"config.json": json.dumps({**TINY, "num_hidden_layers": 7})})
    shape = load_shape("qwen3-8b")  # an alias reaches the cache too
    assert shape.num_layers == 7 and not shape.from_builtin


def test_explicit_hf_cache_option_overrides_the_environment(hf_cache, tmp_path, capsys):
    other = tmp_path / "other-cache"
    snapshot = cache_model(other, "acme/Tiny", {"config.json": json.dumps(TINY)})
    assert main(["plan", "--model", "acme/Tiny", "--device", "H200", "--hf-cache", str(other)]) == 0
    assert f"Hugging Face cache {snapshot}" in capsys.readouterr().out


def test_revision_by_branch_and_by_commit(hf_cache, capsys):
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps(TINY)})
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps({**TINY, "num_hidden_layers": 12})},
                commit=V2_COMMIT, ref="v2")
    assert load_shape("acme/Tiny").num_layers == 30
    assert load_shape("acme/Tiny", revision="v2").num_layers == 12
    assert load_shape("acme/Tiny", revision=V2_COMMIT).num_layers == 12
    assert main(["plan", "--model", "acme/Tiny", "--revision", "v2", "--device", "H200"]) == 0
    assert "model acme/Tiny@v2 on H200" in capsys.readouterr().out


def test_unknown_revision_names_the_missing_ref(hf_cache):
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps(TINY)})
    with pytest.raises(ModelError) as caught:
        load_shape("acme/Tiny", revision="nope")
    ref = hf_cache / "models--acme--Tiny" / "refs" / "nope"
    assert f"no {ref} naming the commit of 'nope'" in str(caught.value)


def test_offline_with_an_empty_cache_says_where_it_looked_and_what_to_do(hf_cache, capsys):
    assert main(["plan", "--model", "acme/Missing-7B", "--device", "H200"]) == 2
    err = capsys.readouterr().err
    expected = hf_cache / "models--acme--Missing-7B" / "snapshots" / "<commit>" / "config.json"
    assert "no config.json for model 'acme/Missing-7B'" in err
    assert "local folder: acme/Missing-7B does not exist" in err
    assert f"Hugging Face cache: no {expected}" in err
    assert "hub: not asked, HF_HUB_OFFLINE is set" in err
    assert "hf download acme/Missing-7B config.json" in err and "pass a local model folder" in err


def test_an_unreachable_hub_fails_fast_with_its_error(hf_cache, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(ModelError) as caught:
        load_shape("acme/Missing-7B")
    assert f"hub: http://127.0.0.1:{port} unreachable (127.0.0.1:{port}:" in str(caught.value)


def test_local_folder_comes_first(hf_cache, tmp_path):
    folder = tmp_path / "acme" / "Tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": 3}))
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps(TINY)})
    shape = load_shape(str(folder))
    assert (shape.num_layers, shape.source) == (3, f"local folder {folder}")
    (folder / "config.json").unlink()
    with pytest.raises(ModelError, match="holds no config.json"):
        load_shape(str(folder))


def test_builtin_fallback_is_marked_in_the_output(hf_cache, capsys):
    assert main(["plan", "--model", "Qwen/Qwen3-8B", "--device", "H200"]) == 0
    out = capsys.readouterr().out
    assert "note: model config from a built-in copy of its published config.json" in out
    assert "hf download Qwen/Qwen3-8B config.json" in out


def test_node_dry_run_plans_a_cached_model(hf_cache):
    cache_model(hf_cache, "acme/Tiny", {"config.json": json.dumps(TINY)})
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "node", "--dry-run", "--model", "acme/Tiny",
                           "--devices", "cpu", "--cpu-workers", "1", "--max-model-len", "2048"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "plan for acme/Tiny (1 workers" in done.stdout


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """The hub's `/{repo}/resolve/{revision}/{file}` endpoint for one repo: what hf_hub_download asks."""

    files = {"/acme/Remote/resolve/main/config.json": json.dumps(TINY).encode(),
             "/acme/Remote/resolve/main/model.safetensors.index.json":
                 json.dumps({"metadata": {"total_size": 3 * 1024**3}}).encode()}

    def do_HEAD(self):
        self._answer(send_body=False)

    def do_GET(self):
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", MAIN_COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub.constants

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    # huggingface_hub read HF_HUB_OFFLINE once, at import, under this suite's offline fixture
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield
    server.shutdown()
    server.server_close()


def test_hub_download_fills_the_cache_when_the_hub_answers(hf_cache, fake_hub):
    shape = load_shape("acme/Remote")
    assert (shape.num_layers, shape.weight_bytes()) == (30, 3 * 1024**3)
    snapshot = hf_cache / "models--acme--Remote" / "snapshots" / MAIN_COMMIT
    assert shape.source == f"the hub, now cached in {snapshot}"
    assert json.loads((snapshot / "config.json").read_text()) == TINY
    with pytest.raises(ModelError, match="hub: RepositoryNotFoundError"):
        load_shape("acme/Elsewhere")
