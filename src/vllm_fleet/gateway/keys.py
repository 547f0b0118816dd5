"""API keys: stored as sha256 hashes in a keys file, each with its own limits.

The keys file has one JSON object per line (blank lines and `#` comments allowed):

    {"id": "team-search", "sha256": "<hex sha256 of the key>", "limits": {"requests_per_min": 600}, "admin": false}

`limits` are the router's `KeyLimits` fields. `admin: true` keys may also read /metrics and the
dashboard data. The key itself is never stored or logged; only its id is. `vllm-fleet gateway
keys add|revoke|list` edits the file; a running gateway reloads it (keys, admin flags and
limits) on SIGHUP or within `--reload-interval-s` of a change (gateway/reload.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from vllm_fleet.errors import ConfigError

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
    """Parse a keys file; a bad line is a ConfigError naming the line and the field."""
    records: list[KeyRecord] = []
    seen: set[str] = set()
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            record = _record(json.loads(line))
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not a key record: {exc}; expected "
                              '{"id": ..., "sha256": ..., "limits": {...}, "admin": false}') from None
        if record.id in seen:
            raise ConfigError(f"{path}:{number}: key id {record.id!r} appears twice")
        seen.add(record.id)
        records.append(record)
    return records


def _record(data: object) -> KeyRecord:
    """One line's record; ValueError naming the field that is wrong."""
    if not isinstance(data, dict):
        raise ValueError("a line must be a JSON object")
    for name in ("id", "sha256"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise ValueError(f"field {name!r} must be a non-empty string")
    sha256 = data["sha256"].lower()
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError("field 'sha256' must be 64 hex digits (the hash of the key, not the key)")
    if not isinstance(data.get("admin", False), bool):
        raise ValueError("field 'admin' must be true or false")  # "false" as a string would be truthy
    limits = data.get("limits") or {}
    if not isinstance(limits, dict):
        raise ValueError('field \'limits\' must be an object like {"requests_per_min": 600}')
    _check_limits(limits)
    return KeyRecord(id=data["id"], sha256=sha256, limits=dict(limits), admin=data.get("admin", False))


def _check_limits(limits: dict) -> None:
    from vllm_fleet.router.config import KeyLimits  # the router's model: one definition of the fields

    try:
        KeyLimits(**limits)
    except ValidationError as exc:
        problems = "; ".join(f"limits.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(problems) from None


def read_keys_file(path: str | Path) -> list[KeyRecord]:
    """`read_keys`, with an unreadable file a ConfigError too."""
    try:
        return read_keys(path)
    except OSError as exc:
        raise ConfigError(f"cannot read API keys file {path}: {exc.strerror or exc}") from None


def write_keys(path: str | Path, records: list[KeyRecord]) -> None:
    """Replace the file atomically, readable by its owner only."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in records))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class KeyStore:
    """Looks presented keys up. Holds the records of `path` as last loaded; the gateway's
    reloader (reload.py) swaps in new ones with `replace` when the file changes or on SIGHUP."""

    def __init__(self, path: str | Path, records: list[KeyRecord] | None = None) -> None:
        self.path = Path(path)
        self._by_hash: dict[bytes, KeyRecord] = {}
        self.replace(read_keys_file(self.path) if records is None else records)

    def replace(self, records: list[KeyRecord]) -> None:
        """Use `records` from now on: a removed key fails its next request (one dict swap)."""
        self._by_hash = {bytes.fromhex(r.sha256): r for r in records}

    def authenticate(self, presented: str) -> KeyRecord | None:
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
