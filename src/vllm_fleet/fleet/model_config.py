"""Where a model's config.json comes from, for the capacity model of `plan`, `gpus` and `node`.

A `--model` value is looked up, in this order:

1. a local folder holding config.json;
2. the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub,
   or `--hf-cache`), read through huggingface_hub at the branch, tag or commit asked for
   (default `main`): the files vLLM itself would load on that machine;
3. the hub, unless HF_HUB_OFFLINE is set. A TCP probe of the endpoint comes first, because
   huggingface_hub retries an unreachable hub for ~25 s before giving up;
4. a built-in copy of the fields that matter, for three reference models, marked as such.

When none has it, ModelError names every place looked and how to fill the cache.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.config import env_hf_endpoint, env_hf_hub_cache, env_hf_offline
from vllm_fleet.errors import ModelError

logger = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT_S = 3.0   # a TCP connect to the hub; a machine without access fails in this long at most
HUB_TIMEOUT_S = 10.0        # huggingface_hub's metadata request, once the hub answered the probe
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_INDEX = "model.safetensors.index.json"

# The fields that matter, from the models' published config.json files: the last resort when a
# machine has neither the model's files nor hub access.
BUILTIN_CONFIGS: dict[str, dict] = {
    "Qwen/Qwen3.5-9B": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {
            "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
            "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": 32, "full_attention_interval": 4, "max_position_embeddings": 262144,
            "tie_word_embeddings": False, "dtype": "bfloat16",
        },
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "meta-llama/Llama-3.1-8B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
}
ALIASES = {
    "qwen3.5-9b": "Qwen/Qwen3.5-9B", "qwen3-8b": "Qwen/Qwen3-8B", "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
}


@dataclass(frozen=True)
class ModelConfig:
    """A model's config.json content and where it was found."""

    name: str                  # folder name, or the HF id (with @revision when one was asked for)
    config: dict
    source: str                # where it came from, for the user: a folder, a cache snapshot, the hub, built-in
    weight_bytes: int = 0      # from the safetensors files or their index, when found; 0: count parameters
    builtin: bool = False      # a built-in copy of the published config, not the model's own files


def find_model_config(model: str, *, hf_cache: str | Path | None = None, revision: str | None = None) -> ModelConfig:
    """Look `model` up as the module docstring says; ModelError when nothing has its config.json."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        return _from_folder(folder)
    if folder.exists():
        raise ModelError(f"--model {model!r} is a file; the capacity model reads config.json from a model folder")
    repo_id = ALIASES.get(model.lower(), model)
    if not _REPO_ID.match(repo_id):
        raise ModelError(
            f"--model {model!r} is neither a local folder nor a Hugging Face id like 'Qwen/Qwen3-8B'"
        )
    cache = Path(hf_cache).expanduser() if hf_cache else env_hf_hub_cache()
    looked = [f"local folder: {folder} does not exist"]
    found = _from_cache(repo_id, cache, revision, looked) or _from_hub(repo_id, cache, revision, looked)
    if found is not None:
        return found
    if repo_id in BUILTIN_CONFIGS:
        logger.warning("config.json of %s not found (%s); using the built-in copy", repo_id, "; ".join(looked))
        return ModelConfig(
            name=repo_id, config=BUILTIN_CONFIGS[repo_id], builtin=True,
            source=f"a built-in copy of its published config.json (not found locally, in {cache} or on the hub; "
                   f"`{_download_command(repo_id, revision)}` reads the real one)",
        )
    raise ModelError(_not_found(model, repo_id, revision, looked))


def _from_folder(folder: Path) -> ModelConfig:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelError(f"--model folder {folder} holds no config.json; point --model at a Hugging Face model folder")
    return ModelConfig(name=folder.name, config=_read_json(config_path), source=f"local folder {folder}",
                       weight_bytes=_folder_weight_bytes(folder))


def _from_cache(repo_id: str, cache: Path, revision: str | None, looked: list[str]) -> ModelConfig | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        looked.append(f"Hugging Face cache {cache}: not read, huggingface_hub is not installed")
        return None
    path = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=revision)
    if not isinstance(path, str):
        recorded = path is not None  # huggingface_hub's marker: the hub said this file does not exist
        looked.append(f"Hugging Face cache: {'the cache records no' if recorded else 'no'} "
                      f"{_expected_path(cache, repo_id, revision)}")
        return None
    snapshot = Path(path).parent
    index = try_to_load_from_cache(repo_id, _INDEX, cache_dir=cache, revision=revision)
    single = try_to_load_from_cache(repo_id, "model.safetensors", cache_dir=cache, revision=revision)
    weights = _index_bytes(Path(index)) if isinstance(index, str) else 0
    if not weights and isinstance(single, str):
        weights = Path(single).stat().st_size
    return ModelConfig(name=_display(repo_id, revision), config=_read_json(Path(path)),
                       source=f"Hugging Face cache {snapshot}", weight_bytes=weights)


def _from_hub(repo_id: str, cache: Path, revision: str | None, looked: list[str]) -> ModelConfig | None:
    if env_hf_offline():
        looked.append("hub: not asked, HF_HUB_OFFLINE is set")
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        looked.append("hub: not asked, huggingface_hub is not installed")
        return None
    endpoint = env_hf_endpoint()
    unreachable = _unreachable(endpoint, HUB_PROBE_TIMEOUT_S)
    if unreachable:
        looked.append(f"hub: {endpoint} unreachable ({unreachable})")
        return None
    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache, endpoint=endpoint,
                               etag_timeout=HUB_TIMEOUT_S)
    except (OSError, ValueError) as exc:  # huggingface_hub's not-found / gated / HTTP errors are OSErrors
        looked.append(f"hub: {_first_line(exc)}" + (f" ({_first_line(exc.__cause__)})" if exc.__cause__ else ""))
        return None
    weights = 0
    try:
        weights = _index_bytes(Path(hf_hub_download(repo_id, _INDEX, revision=revision, cache_dir=cache,
                                                    endpoint=endpoint, etag_timeout=HUB_TIMEOUT_S)))
    except (OSError, ValueError):
        logger.info("%s has no %s on the hub; weights are counted from its config", repo_id, _INDEX)
    return ModelConfig(name=_display(repo_id, revision), config=_read_json(Path(path)),
                       source=f"the hub, now cached in {Path(path).parent}", weight_bytes=weights)


def _unreachable(endpoint: str, timeout_s: float) -> str | None:
    """None when a TCP connection to the hub (or the proxy on the way) opens in time, else why not.

    In a thread, because name resolution has no timeout of its own.
    """
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or "", proxy_url.port or 80
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc}")

    thread = threading.Thread(target=connect, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0] if outcome else f"{host}:{port}: no connection within {timeout_s:g} s"


def _expected_path(cache: Path, repo_id: str, revision: str | None) -> str:
    """The file the cache would hold, as exactly as the cache lets us say (a branch resolves to a commit)."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        return f"{repo_dir / 'snapshots' / '<commit>' / 'config.json'} (no folder {repo_dir})"
    ref_name = revision or "main"
    ref = repo_dir / "refs" / ref_name
    if ref.is_file():
        return str(repo_dir / "snapshots" / ref.read_text().strip() / "config.json")
    if re.fullmatch(r"[0-9a-f]{40}", ref_name):
        return str(repo_dir / "snapshots" / ref_name / "config.json")
    return f"{repo_dir / 'snapshots' / '<commit>' / 'config.json'} (no {ref} naming the commit of {ref_name!r})"


def _not_found(model: str, repo_id: str, revision: str | None, looked: list[str]) -> str:
    places = "\n".join(f"  - {place}" for place in looked)
    return (
        f"no config.json for model {model!r}{f' at revision {revision!r}' if revision else ''}; looked in:\n{places}\n"
        f"Fill the cache where the hub is reachable: `{_download_command(repo_id, revision)}` (with older "
        f"huggingface_hub: `huggingface-cli download ...`), and copy it here, pointing HF_HUB_CACHE or --hf-cache "
        f"at it; or pass a local model folder as --model. Built-in copies exist only for {', '.join(BUILTIN_CONFIGS)}"
    )


def _download_command(repo_id: str, revision: str | None) -> str:
    return f"hf download {repo_id} config.json {_INDEX}" + (f" --revision {revision}" if revision else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _display(repo_id: str, revision: str | None) -> str:
    return f"{repo_id}@{revision}" if revision else repo_id


def _read_json(path: Path) -> dict:
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from None
    if not isinstance(content, dict):
        raise ModelError(f"{path} is not a JSON object")
    return content


def _index_bytes(index: Path) -> int:
    """`metadata.total_size` of a safetensors index: the exact bytes of all shards."""
    try:
        return int(_read_json(index).get("metadata", {}).get("total_size") or 0)
    except (ModelError, TypeError, ValueError):
        logger.warning("%s has no readable metadata.total_size; weights are counted from the config", index)
        return 0


def _folder_weight_bytes(folder: Path) -> int:
    index = folder / _INDEX
    if index.is_file():
        return _index_bytes(index)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
