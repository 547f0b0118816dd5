"""TokenizerFiles: the files of the tokenizer this worker's engine renders prompts with.

A router renders and tokenizes prompts for routing only (router/prompt/tokenizers.py); what the
engine runs is still this worker's rendering. So the files sent are those the engine loaded
its tokenizer from, as the engine names them (`Engine.tokenizer_source`):

- the real engine: vLLM's `model_config.tokenizer`: `--tokenizer` when set, else the model.
  The packaged default is a GGUF file converted once into an HF folder (models.py) whose
  tokenizer files, chat template included, vLLM loads: that folder is sent. A Hub id is read
  from the local Hub cache (vLLM downloaded it there), never fetched here.
- the mock engine: `--mock-tokenizer`, the folder it tokenizes with; without one it has no
  tokenizer and the call fails with FAILED_PRECONDITION.

There is no chat template override to add: the worker renders with the model's own template
(render.py passes none, and a request may not bring one, prepare.py), and our config has no
`--chat-template`. Only names on the allow-list (protocol/tokenizer_files.py) are read.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vllm_fleet.errors import TokenizerFilesError
from vllm_fleet.protocol.tokenizer_files import ALLOWED_NAMES, chunks_of
from vllm_fleet.worker.engines.base import Engine

logger = logging.getLogger(__name__)

# A folder needs one of these to hold a tokenizer (the others only describe it).
_TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def tokenizer_folder(source: str | None, revision: str | None = None) -> Path:
    """The local folder of the tokenizer `source` names (a folder or a Hub id already cached)."""
    if not source:
        raise TokenizerFilesError("this worker's engine has no tokenizer (a mock engine without "
                                  "--mock-tokenizer); routers route its model without token ids")
    path = Path(source).expanduser()
    if path.is_file():
        raise TokenizerFilesError(f"the tokenizer is inside {path.name}, not in files; start the worker "
                                  "with --tokenizer pointing at the model's Hugging Face tokenizer folder")
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, revision=revision, local_files_only=True,
                                      allow_patterns=sorted(ALLOWED_NAMES)))
    except Exception as exc:  # not in the local Hub cache, or no huggingface_hub
        raise TokenizerFilesError(f"the tokenizer {source!r} is not a local folder nor in the local Hub "
                                  f"cache ({exc}); start the worker with --tokenizer FOLDER") from None


def read_tokenizer_files(engine: Engine) -> list[tuple[str, bytes, bool]]:
    """Every chunk (name, data, last) of the engine's tokenizer files, in name order.

    Blocking (reads a few MB): run it in a thread. Raises TokenizerFilesError when there is
    nothing to send."""
    folder = tokenizer_folder(engine.tokenizer_source, getattr(engine, "tokenizer_revision", None))
    names = sorted(name for name in ALLOWED_NAMES if (folder / name).is_file())
    if not any(name in names for name in _TOKENIZER_CORE):
        raise TokenizerFilesError(f"{folder} holds no tokenizer files (tokenizer.json, vocab.json, ...)")
    chunks = [chunk for name in names for chunk in chunks_of(name, (folder / name).read_bytes())]
    logger.info("sending tokenizer files from %s: %s", folder, ", ".join(names))
    return chunks
