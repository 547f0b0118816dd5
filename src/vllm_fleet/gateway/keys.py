"""API keys: stored as sha256 hashes in a keys file, each with its own limits.

The keys file has one JSON object per line (blank lines and `#` comments allowed):

    {"id": "team-search", "sha256": "<hex sha256 of the key>", "limits": {"requests_per_min": 600}, "admin": false}

`limits` are the router's `KeyLimits` fields. `admin: true` keys may also read /metrics and the
dashboard data. The key itself is never stored or logged; only its id is. `vllm-fleet gateway
keys add|revoke|list` edits the file; a running gateway picks new and revoked keys up within
seconds (changed limits apply after a restart: the router's admission reads them at startup).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.errors import ConfigError

logger = logging.getLogger(__name__)

KEY_PREFIX = "sk-fleet-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class KeyRecord:
    id: str
    sha256: str
    limits: dict = field(default_factory=dict)
    admin: bool = False

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "sha256": self.sha256, "limits": self.limits, "admin": self.admin})


def read_keys(path: str | Path) -> list[KeyRecord]:
    """Parse a keys file; a bad line is a ConfigError naming the line."""
    records: list[KeyRecord] = []
    seen: set[str] = set()
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            data = json.loads(line)
            record = KeyRecord(id=str(data["id"]), sha256=str(data["sha256"]).lower(),
                               limits=dict(data.get("limits") or {}), admin=bool(data.get("admin", False)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a key record ({exc}); expected "
                              '{"id": ..., "sha256": ..., "limits": {...}}') from None
        if len(record.sha256) != 64 or any(c not in "0123456789abcdef" for c in record.sha256):
            raise ConfigError(f"{path}:{number}: sha256 must be 64 hex digits (the hash of the key, not the key)")
        if record.id in seen:
            raise ConfigError(f"{path}:{number}: key id {record.id!r} appears twice")
        seen.add(record.id)
        records.append(record)
    return records


def write_keys(path: str | Path, records: list[KeyRecord]) -> None:
    """Replace the file atomically, readable by its owner only."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in records))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class KeyStore:
    """Looks presented keys up; reloads the file when it changes (checked at most every `recheck_s`)."""

    def __init__(self, path: str | Path, *, recheck_s: float = 2.0) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._by_hash: dict[bytes, KeyRecord] = {}
        self._mtime: float | None = None
        self._checked = 0.0
        self._load()

    def _load(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError as exc:
            raise ConfigError(f"cannot read API keys file {self.path}: {exc}") from None
        records = read_keys(self.path)
        if self._mtime is not None:
            self._warn_limit_changes(records)
        self._by_hash = {bytes.fromhex(r.sha256): r for r in records}
        self._mtime = mtime
        logger.info("loaded %d API keys from %s", len(records), self.path)

    def _warn_limit_changes(self, records: list[KeyRecord]) -> None:
        # The router's admission takes per-key limits at startup; keys and revocations reload live.
        before = {r.id: r.limits for r in self._by_hash.values()}
        changed = [r.id for r in records if r.limits and before.get(r.id) != r.limits]
        if changed:
            logger.warning("limits of keys %s changed in %s: they apply after a gateway restart "
                           "(until then these keys have the router's default limits or their old ones)",
                           ", ".join(changed), self.path)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.recheck_s:
            return
        self._checked = now
        try:
            if self.path.stat().st_mtime_ns != self._mtime:
                self._load()
        except (OSError, ConfigError) as exc:
            # Keep serving with the keys we have; a broken edit must not lock everyone out.
            logger.error("keeping the previous API keys: %s", exc)

    def authenticate(self, presented: str) -> KeyRecord | None:
        self._maybe_reload()
        digest = hashlib.sha256(presented.encode()).digest()
        # The dict lookup is keyed by the hash, whose timing tells nothing about valid keys;
        # the final comparison is constant-time all the same.
        record = self._by_hash.get(digest)
        if record is None or not hmac.compare_digest(bytes.fromhex(record.sha256), digest):
            return None
        return record

    def records(self) -> list[KeyRecord]:
        return list(self._by_hash.values())

    def __len__(self) -> int:
        return len(self._by_hash)
