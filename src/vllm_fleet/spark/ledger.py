"""The answer ledger: every answer a job generated, by row, so that a replay is answered from it.

A streaming query that crashed replays its last micro-batch, and a retried task re-reads its
partition; without the ledger every row of those is generated again. With
`generate(..., ledger_path=DIR, id_col=...)` an executor looks a row up before sending it: a row
found is answered from the ledger (`attempts` = 0, no worker request, counted as replayed), a
row not found is generated and written to the ledger as it finishes.

Layout: DIR holds append-only JSON-lines files, one per task attempt
(`<stage>-<partition>-<attempt>-<random>.jsonl`), and the `compact-<random>.jsonl` files
`compact_ledger` writes. A line is one answered row:
`{"key", "output", "finish_reason", "prompt_tokens", "completion_tokens", "worker", "at"}`,
plus `scope`, `session`, `turn`, `messages` for a conversation's turn (its history for a later
micro-batch, see sessions.py). The key is the row's request id (rows.request_id_for): the prompt
or messages, the sampling params, the model and the row key (the id_col value, or session and
turn), so the same row asked with other params or of another model is another entry. Only
answers are written; a row that ended in an error is sent again on replay.

Durability: a line is one `os.write` on an O_APPEND descriptor as the row finishes, so it
survives the process being killed; the file is fsync'd before the task hands back each Arrow
batch, so every row a sink can commit is on disk before the commit (survives losing the machine).
Readers: each executor process keeps one index per ledger directory and, at the start of each
task, reads only the bytes appended since (files are only appended to), up to the last complete
line; the half line a killed writer may leave is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.protocol.types import ChatMessage
from vllm_fleet.spark.rows import RowResult

logger = logging.getLogger(__name__)
SUFFIX = ".jsonl"


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    output: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    worker: str | None = None
    at: float = 0.0
    scope: str | None = None     # model and params of a session turn: turns of other jobs do not mix
    session: str | None = None   # repr of the session key
    turn: Any = None
    messages: list[list[str]] | None = None  # the turn's own messages, [role, content]

    def result(self) -> RowResult:
        """The row's answer from the ledger: no worker was tried now, so attempts is 0."""
        return RowResult(output=self.output, finish_reason=self.finish_reason, prompt_tokens=self.prompt_tokens,
                         completion_tokens=self.completion_tokens, attempts=0, worker=self.worker)


def session_scope(model: str | None, params: dict[str, Any]) -> str:
    payload = json.dumps([model, params], sort_keys=True, default=str)
    return hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()


class LedgerIndex:
    """One executor process's view of a ledger directory: entries by key, session turns by
    (scope, session). `refresh()` reads what other processes appended since the last call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._entries: dict[str, Entry] = {}
        self._turns: dict[tuple[str, str], dict[Any, Entry]] = {}

    def refresh(self) -> None:
        with self._lock:
            for name in sorted(os.listdir(self.path)):
                if name.endswith(SUFFIX) and not name.startswith("."):
                    self._read_new(name)

    def _read_new(self, name: str) -> None:
        offset = self._offsets.get(name, 0)
        try:
            with open(os.path.join(self.path, name), "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:  # compacted away; its entries are in a compact file
            return
        end = data.rfind(b"\n") + 1  # a line without its newline is still being written (or never will be)
        for line in data[:end].splitlines():
            try:
                self._add(Entry(**json.loads(line)))
            except (ValueError, TypeError):
                logger.warning("ledger %s: skipping an unreadable line in %s", self.path, name)
        self._offsets[name] = offset + end

    def add(self, entry: Entry) -> None:
        with self._lock:
            self._add(entry)

    def _add(self, entry: Entry) -> None:
        known = self._entries.get(entry.key)
        if known is None or known.at <= entry.at:
            self._entries[entry.key] = entry
        if entry.session is not None and entry.scope is not None:
            self._turns.setdefault((entry.scope, entry.session), {})[entry.turn] = entry

    def get(self, key: str) -> Entry | None:
        with self._lock:
            return self._entries.get(key)

    def history(self, scope: str, session: str, before_turn: Any) -> list[ChatMessage]:
        """The messages of the session's turns before `before_turn`, each followed by its answer."""
        with self._lock:
            turns = sorted(((t, e) for t, e in self._turns.get((scope, session), {}).items() if t < before_turn),
                           key=lambda pair: pair[0])
        messages: list[ChatMessage] = []
        for _, entry in turns:
            messages += [ChatMessage(role=role, content=content) for role, content in entry.messages or []]
            messages.append(ChatMessage(role="assistant", content=entry.output))
        return messages


_indexes: dict[str, LedgerIndex] = {}
_indexes_lock = threading.Lock()


def index_for(path: str) -> LedgerIndex:
    """This process's index of the ledger at `path` (kept across tasks), brought up to date."""
    with _indexes_lock:
        index = _indexes.get(path)
        if index is None:
            os.makedirs(path, exist_ok=True)
            index = _indexes[path] = LedgerIndex(path)
    index.refresh()
    return index


class TaskLedger:
    """One task's use of the ledger: lookups, and its own append-only file for what it generates."""

    def __init__(self, index: LedgerIndex, task_name: str) -> None:
        self.index = index
        self.file = os.path.join(index.path, f"{task_name}-{uuid.uuid4().hex[:8]}{SUFFIX}")
        self._fd: int | None = None
        self.replayed = 0
        self.generated = 0

    def lookup(self, key: str) -> RowResult | None:
        entry = self.index.get(key)
        if entry is None:
            return None
        self.replayed += 1
        return entry.result()

    def history(self, scope: str, session: str, before_turn: Any) -> list[ChatMessage]:
        return self.index.history(scope, session, before_turn)

    def record(self, key: str, result: RowResult, **turn: Any) -> None:
        """Write one generated answer (an error is not an answer: it is not written)."""
        if result.error is not None or result.output is None:
            return
        entry = Entry(key=key, output=result.output, finish_reason=result.finish_reason,
                      prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                      worker=result.worker, at=time.time(), **turn)
        if self._fd is None:
            self._fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, (json.dumps(asdict(entry), default=str) + "\n").encode())
        self.index.add(entry)
        self.generated += 1

    def sync(self) -> None:
        """fsync what this task wrote: called before each Arrow batch leaves the task."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def compact_ledger(path: str, *, max_age_s: float | None = None, idle_s: float = 3600.0) -> tuple[int, int]:
    """Merge the ledger's files not written to for `idle_s` (their tasks ended or died) into one
    file, one entry per key, dropping entries older than `max_age_s`; returns (kept, dropped).
    The merged file is written aside, fsync'd and renamed in before its sources are removed, so
    a reader sees every entry at every moment (some twice, which is harmless)."""
    now = time.time()
    sources = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(SUFFIX) and not n.startswith(".")]
    sources = [s for s in sources if now - os.path.getmtime(s) >= idle_s]
    merged = LedgerIndex(path)
    for source in sources:
        merged._read_new(os.path.basename(source))
    entries = list(merged._entries.values())
    kept = [e for e in entries if max_age_s is None or now - e.at <= max_age_s]
    if len(sources) <= 1 and len(kept) == len(entries):
        return len(kept), 0
    name = f"compact-{uuid.uuid4().hex[:8]}{SUFFIX}"
    aside = os.path.join(path, f".{name}.tmp")
    with open(aside, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(asdict(e), default=str) + "\n" for e in kept)
        f.flush()
        os.fsync(f.fileno())
    os.rename(aside, os.path.join(path, name))
    for source in sources:
        os.unlink(source)
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return len(kept), len(entries) - len(kept)
