"""The files a worker sends for its model's tokenizer (TokenizerFiles), and how a receiver keeps them.

Both ends check names against one allow-list: plain file names, never folders, so a worker
serves nothing else from its disk and a router writes nothing outside the folder it chose,
whatever a peer sends. A file travels as chunks of at most CHUNK_BYTES, in order, the last one
flagged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from vllm_fleet.errors import TokenizerFilesError

# What a Hugging Face tokenizer (fast or slow), its chat template and the defaults vLLM reads
# beside it are made of. config.json: AutoTokenizer reads the model type from it when
# tokenizer_config.json names no class; generation_config.json: the sampling defaults.
ALLOWED_NAMES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
    "chat_template.jinja", "chat_template.json", "generation_config.json", "config.json",
})
CHUNK_BYTES = 1024 * 1024  # gRPC's default message limit is 4 MiB; a tokenizer.json is 2-30 MB


def is_allowed(name: str) -> bool:
    """A name on the allow-list, as a plain name (no folder, no `..`)."""
    return name in ALLOWED_NAMES and os.path.basename(name) == name


def chunks_of(name: str, data: bytes) -> Iterator[tuple[str, bytes, bool]]:
    """(name, part, last) for one file; an empty file is one empty, last chunk."""
    for start in range(0, max(len(data), 1), CHUNK_BYTES):
        part = data[start:start + CHUNK_BYTES]
        yield name, part, start + CHUNK_BYTES >= len(data)


def files_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """One digest of a tokenizer's files (name and bytes, any order): the worker reports it in
    WorkerInfo.tokenizer_digest for the files it sends, the router computes it over the files it
    received, and a router's token ids travel to a worker only where the two agree."""
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def folder_digest(folder: str | os.PathLike[str]) -> str:
    """`files_digest` of the allow-listed files in `folder` (those a worker sends, or a router got)."""
    path = Path(folder)
    return files_digest((name, (path / name).read_bytes()) for name in ALLOWED_NAMES if (path / name).is_file())


class FileAssembler:
    """Writes received chunks into `folder`, each file whole or not at all."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._open: dict[str, list[bytes]] = {}
        self.written: list[str] = []

    def add(self, name: str, data: bytes, last: bool) -> None:
        if not is_allowed(name):
            raise TokenizerFilesError(f"refused tokenizer file {name!r}: not a tokenizer file name "
                                      f"({', '.join(sorted(ALLOWED_NAMES))})")
        self._open.setdefault(name, []).append(data)
        if last:
            parts = self._open.pop(name)
            staging = self.folder / f".{name}.part"
            staging.write_bytes(b"".join(parts))
            os.replace(staging, self.folder / name)
            self.written.append(name)

    def finish(self) -> list[str]:
        """The names written; a file still open (its last chunk never came) is an error."""
        if self._open:
            raise TokenizerFilesError(f"tokenizer files cut short: {', '.join(sorted(self._open))}")
        return list(self.written)
