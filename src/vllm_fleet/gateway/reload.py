"""Reload the API keys file and the per-key limits while the gateway serves.

Two triggers: SIGHUP (the CLI calls `GatewayServer.reload`), and a poll of the watched files
every `--reload-interval-s`. The poll compares each file's (mtime, size, inode): an atomic
replace, as `vllm-fleet gateway keys` does, changes the inode even within one mtime tick. A
stat per file per interval is all it costs, and it needs no file-watching dependency.

A reload reads everything first — the keys file, then the limits source (a `--key-limits
@FILE`) — and applies all or nothing. A broken file is logged with its line and field, and the
previous keys and limits stay in force: a half-written edit never locks everyone out, and the
gateway never ends up open (an empty keys file means every key is refused, not none needed).
Applying is two swaps on the event loop, the key table and the router's admission limits, so
streams in flight run on with their reservations, and a removed key fails its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.errors import ConfigError
from vllm_fleet.gateway.keys import KeyRecord, KeyStore, read_keys_file
from vllm_fleet.router import AdmissionConfig, KeyLimits, Router

logger = logging.getLogger(__name__)

Stamp = tuple[int, int, int] | None  # (mtime_ns, size, inode); None: the file is missing


@dataclass(frozen=True)
class LimitsSource:
    """Where the router's key limits come from besides the keys file: `read()` builds them
    again (the CLI re-reads a `--key-limits @FILE`); `path` is that file, watched for changes."""

    read: Callable[[], AdmissionConfig]
    path: Path | None = None

    @classmethod
    def fixed(cls, admission: AdmissionConfig) -> LimitsSource:
        return cls(read=lambda: admission)


@dataclass(frozen=True)
class Loaded:
    """One consistent read of everything a reload applies."""

    records: list[KeyRecord] | None  # None: the gateway has no keys file
    admission: AdmissionConfig       # limits from the command line, --key-limits and the keys file


def admission_with_keys(admission: AdmissionConfig, records: list[KeyRecord] | None) -> AdmissionConfig:
    """`admission` with each key's limits from the keys file over the --key-limits overrides."""
    overrides = dict(admission.keys)
    for record in records or ():
        if record.limits:
            overrides[record.id] = KeyLimits(**record.limits)  # read_keys validated them, naming the line
    return admission.model_copy(update={"keys": overrides})


def file_stamp(path: Path) -> Stamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class Reloader:
    """Loads keys and limits (`load`), then keeps the KeyStore and the Router up to date with
    them once `bind` has given it both: on `reload()` and, with `interval_s` > 0, on a change."""

    def __init__(self, keys_path: str | Path | None, limits: LimitsSource, *, interval_s: float) -> None:
        self.keys_path = Path(keys_path) if keys_path else None
        self.limits = limits
        self.interval_s = interval_s
        self.paths = [p for p in (self.keys_path, limits.path) if p is not None]
        self._stamps: dict[Path, Stamp] = {}
        self._keys: KeyStore | None = None
        self._router: Router | None = None
        self._task: asyncio.Task | None = None

    def load(self) -> Loaded:
        """Read the keys file and the limits; ConfigError naming the file, line and field."""
        # Stamps first: a write that lands while we read is seen as a change by the next poll.
        stamps = {path: file_stamp(path) for path in self.paths}
        records = read_keys_file(self.keys_path) if self.keys_path else None
        admission = admission_with_keys(self.limits.read(), records)
        self._stamps = stamps
        return Loaded(records, admission)

    def bind(self, router: Router, keys: KeyStore | None) -> None:
        self._router, self._keys = router, keys

    def reload(self) -> bool:
        """Read and apply everything now; on a bad file log why and keep what is in force."""
        if self._router is None:
            raise RuntimeError("Reloader.reload before bind()")
        before = self._keys.records() if self._keys is not None else []
        try:
            loaded = self.load()
        except ConfigError as exc:
            logger.error("reload refused, the previous API keys and limits stay in force: %s", exc)
            return False
        if self._keys is not None and loaded.records is not None:
            self._keys.replace(loaded.records)
            _log_key_changes(before, loaded.records, self._keys.path)
        self._router.update_limits(keys=loaded.admission.keys, default=loaded.admission.default)
        return True

    def check(self) -> bool:
        """Reload if a watched file changed since the last load; whether it did reload."""
        stamps = {path: file_stamp(path) for path in self.paths}
        if stamps == self._stamps:
            return False
        if self.reload():
            return True
        # A refused file is not retried every poll (one error line per edit), only on its next
        # change or a SIGHUP.
        self._stamps = stamps
        return False

    def start(self) -> None:
        if self.interval_s > 0 and self.paths and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="gateway-reload-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except Exception:  # the watch must outlive any surprise; the next change retries
                logger.exception("checking %s for changes failed", ", ".join(map(str, self.paths)))


def _log_key_changes(before: list[KeyRecord], after: list[KeyRecord], path: Path) -> None:
    old = {r.id: r for r in before}
    new = {r.id: r for r in after}
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    changed = sorted(i for i in new.keys() & old.keys() if new[i] != old[i])
    logger.info("reloaded %d API keys from %s (added: %s; removed: %s; changed: %s)", len(after), path,
                ", ".join(added) or "none", ", ".join(removed) or "none", ", ".join(changed) or "none")
    if not after:
        logger.warning("%s holds no keys: every request that needs a key is refused (401)", path)
