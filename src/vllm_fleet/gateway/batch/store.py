"""The Batch API's state: one SQLite file, and the JSONL files themselves in a folder beside it.

Why both: input and output files can be hundreds of megabytes, and are written once and read
whole, which a plain file does best; what changes line by line (a batch's status, each line's
state and its result, who runs the batch) needs transactions across processes, which SQLite
gives with no server. Each line's result is committed as the line finishes, so a gateway that
restarts resumes a batch with the lines still pending and never runs a finished one again; the
output and error files are written from these rows when the batch ends.

Who runs a batch is a lease row (`lease_owner`, `lease_expires` on the batch): a runner claims
batches whose lease is free or expired, renews it while it runs them, and releases it when it
stops; a runner that lost its lease can no longer commit a line (the commit checks the lease).
So with `--processes N` one process runs a given batch, and another takes it over when that one
dies.

Every method is synchronous and short; the async side calls them through `asyncio.to_thread`
(runner.py, routes.py), since a commit waits on the disk (fsync) and another process may hold
the write lock for a moment (busy_timeout).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Not OpenAI's: this gateway's word on lines waiting for batch capacity (runner.py says why a field).
WAITING_FIELD = "vllm_fleet_waiting"
# A batch in one of these is someone's to run (or to finish).
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    data TEXT NOT NULL,                 -- the rest of OpenAI's batch object, as JSON
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT, lease_expires REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT,
    start INTEGER NOT NULL, length INTEGER NOT NULL,   -- where the request is in the input file
    state TEXT NOT NULL,                               -- pending | done | failed
    result TEXT,                                       -- the output or error line, once finished
    PRIMARY KEY (batch_id, idx));
"""


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def object(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


@dataclass(frozen=True, slots=True)
class LineRow:
    idx: int
    custom_id: str | None
    start: int
    length: int
    state: str = "pending"
    result: str | None = None


class Store:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files_dir = directory / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one connection, used from asyncio.to_thread's threads
        self._db = sqlite3.connect(directory / "batch.sqlite3", isolation_level=None, check_same_thread=False,
                                   timeout=10.0)
        # WAL: readers do not wait for the writer; NORMAL: a commit survives a process crash (not a
        # power cut), enough for results that can be recomputed.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def path_of(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def _write(self, *statements: tuple[str, tuple], all_or_none: bool = False) -> list[int]:
        """Run statements in one write transaction; the row count of each. `all_or_none`: roll
        back when the first statement changes nothing (it is the guard of the rest)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                counts = []
                for sql, args in statements:
                    counts.append(self._db.execute(sql, args).rowcount)
                    if all_or_none and counts[0] == 0:
                        self._db.execute("ROLLBACK")
                        return counts
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return counts

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- files ------------------------------------------------------------------------------

    def add_file(self, row: FileRow) -> None:
        self._write(("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
                     (row.id, row.owner, row.purpose, row.filename, row.bytes, row.created_at)))

    def file(self, file_id: str, owner: str) -> FileRow | None:
        rows = self._read("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        return FileRow(*rows[0]) if rows else None

    def files(self, owner: str, purpose: str | None, limit: int) -> list[FileRow]:
        rows = self._read("SELECT * FROM files WHERE owner = ? AND (? IS NULL OR purpose = ?) "
                          "ORDER BY created_at DESC, id DESC LIMIT ?", (owner, purpose, purpose, limit))
        return [FileRow(*r) for r in rows]

    def delete_file(self, file_id: str, owner: str) -> bool:
        deleted = self._write(("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)))[0] > 0
        if deleted:
            self.path_of(file_id).unlink(missing_ok=True)
        return deleted

    # -- batches ----------------------------------------------------------------------------

    def add_batch(self, batch_id: str, owner: str, created_at: int, data: dict) -> None:
        self._write(("INSERT INTO batches (id, owner, status, created_at, data) VALUES (?, ?, 'validating', ?, ?)",
                     (batch_id, owner, created_at, json.dumps(data))))

    def batch(self, batch_id: str, owner: str | None = None) -> dict | None:
        """OpenAI's batch object; `owner` None: whoever owns it (the runner's view)."""
        rows = self._read("SELECT id, status, created_at, data, total, completed, failed FROM batches "
                          "WHERE id = ? AND (? IS NULL OR owner = ?)", (batch_id, owner, owner))
        return _batch_object(rows[0]) if rows else None

    def batches(self, owner: str, limit: int, after: str | None) -> list[dict]:
        """Newest first; `after`: the ones older than that batch (OpenAI's cursor)."""
        rows = self._read(
            "SELECT id, status, created_at, data, total, completed, failed FROM batches WHERE owner = ? "
            "AND (? IS NULL OR (created_at, id) < (SELECT created_at, id FROM batches WHERE id = ?)) "
            "ORDER BY created_at DESC, id DESC LIMIT ?", (owner, after, after, limit))
        return [_batch_object(r) for r in rows]

    def owner_of(self, batch_id: str) -> str | None:
        rows = self._read("SELECT owner FROM batches WHERE id = ?", (batch_id,))
        return rows[0][0] if rows else None

    def set_status(self, batch_id: str, status: str, *, only_from: tuple[str, ...] = ACTIVE, **fields) -> bool:
        """Move an active batch to `status`, stamping `<status>_at` and setting `fields` in its object."""
        now = int(time.time())
        stamp = {"validating": None, "in_progress": "in_progress_at", "finalizing": "finalizing_at",
                 "completed": "completed_at", "failed": "failed_at", "cancelling": "cancelling_at",
                 "cancelled": "cancelled_at", "expired": "expired_at"}[status]
        if stamp:
            fields[stamp] = now
        marks = ",".join("?" for _ in only_from)
        sql = (f"UPDATE batches SET status = ?, data = json_patch(data, ?) WHERE id = ? AND status IN ({marks})")
        return self._write((sql, (status, json.dumps(fields), batch_id, *only_from)))[0] > 0

    def set_waiting(self, batch_id: str, runner: str, waiting: dict | None) -> bool:
        """The batch's `vllm_fleet_waiting` field (runner.py): its lines waiting for batch capacity
        and why, or None once none waits. Only while in progress and this runner's."""
        patch = json.dumps({WAITING_FIELD: waiting})  # json_patch: null removes the key
        return self._write(("UPDATE batches SET data = json_patch(data, ?) WHERE id = ? AND lease_owner = ? "
                            "AND status = 'in_progress'", (patch, batch_id, runner)))[0] > 0

    # -- leases -----------------------------------------------------------------------------

    def claim(self, runner: str, lease_s: float) -> list[str]:
        """Active batches whose lease is free, expired or already this runner's: now this runner's."""
        now = time.time()
        marks = ",".join("?" for _ in ACTIVE)
        with self._lock:
            rows = self._db.execute(
                f"UPDATE batches SET lease_owner = ?, lease_expires = ? WHERE status IN ({marks}) "
                "AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires < ?) RETURNING id",
                (runner, now + lease_s, *ACTIVE, runner, now)).fetchall()
        return [r[0] for r in rows]

    def renew(self, batch_id: str, runner: str, lease_s: float) -> bool:
        """False when the lease is no longer this runner's (another took it over)."""
        return self._write(("UPDATE batches SET lease_expires = ? WHERE id = ? AND lease_owner = ?",
                            (time.time() + lease_s, batch_id, runner)))[0] > 0

    def release(self, batch_id: str, runner: str) -> None:
        self._write(("UPDATE batches SET lease_owner = NULL, lease_expires = 0 WHERE id = ? AND lease_owner = ?",
                     (batch_id, runner)))

    # -- lines ------------------------------------------------------------------------------

    def add_lines(self, batch_id: str, runner: str, lines: list[LineRow]) -> bool:
        """The batch's lines (malformed ones already failed) and counts, then in_progress: one transaction."""
        failed = sum(1 for line in lines if line.state == "failed")
        statements = [("INSERT OR IGNORE INTO lines VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (batch_id, ln.idx, ln.custom_id, ln.start, ln.length, ln.state, ln.result)) for ln in lines]
        data = json.dumps({"in_progress_at": int(time.time())})
        counts = self._write(
            ("UPDATE batches SET status = 'in_progress', total = ?, failed = ?, data = json_patch(data, ?) "
             "WHERE id = ? AND status = 'validating' AND lease_owner = ?", (len(lines), failed, data, batch_id, runner)),
            *statements, all_or_none=True)
        return counts[0] > 0

    def pending(self, batch_id: str) -> list[LineRow]:
        rows = self._read("SELECT idx, custom_id, start, length FROM lines WHERE batch_id = ? AND state = 'pending' "
                          "ORDER BY idx", (batch_id,))
        return [LineRow(*r) for r in rows]

    def finish_line(self, batch_id: str, runner: str, idx: int, ok: bool, result: str) -> bool:
        """Commit one line's result and the batch's counts together; False (nothing written) when the
        line is no longer pending or the lease is no longer this runner's."""
        column = "completed" if ok else "failed"
        counts = self._write(
            ("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND idx = ? AND state = 'pending' AND "
             "EXISTS (SELECT 1 FROM batches WHERE id = ? AND lease_owner = ?)",
             ("done" if ok else "failed", result, batch_id, idx, batch_id, runner)),
            (f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?", (batch_id,)),
            all_or_none=True)
        return counts[0] > 0

    def results(self, batch_id: str) -> list[tuple[str, str]]:
        """(state, result) of the finished lines, in input order."""
        return self._read("SELECT state, result FROM lines WHERE batch_id = ? AND state != 'pending' ORDER BY idx",
                          (batch_id,))


def _batch_object(row: tuple) -> dict:
    batch_id, status, created_at, data, total, completed, failed = row
    fields = json.loads(data)
    return {
        "id": batch_id, "object": "batch", "endpoint": fields.get("endpoint"), "errors": fields.get("errors"),
        "input_file_id": fields.get("input_file_id"), "completion_window": fields.get("completion_window"),
        "status": status, "output_file_id": fields.get("output_file_id"), "error_file_id": fields.get("error_file_id"),
        "created_at": created_at, "in_progress_at": fields.get("in_progress_at"),
        "expires_at": fields.get("expires_at"), "finalizing_at": fields.get("finalizing_at"),
        "completed_at": fields.get("completed_at"), "failed_at": fields.get("failed_at"),
        "expired_at": fields.get("expired_at"), "cancelling_at": fields.get("cancelling_at"),
        "cancelled_at": fields.get("cancelled_at"),
        "request_counts": {"total": total, "completed": completed, "failed": failed},
        "metadata": fields.get("metadata"),
        # Shown only in progress: a runner stopped mid-wait leaves the last word behind until the next one runs it.
        WAITING_FIELD: fields.get(WAITING_FIELD) if status == "in_progress" else None,
    }
