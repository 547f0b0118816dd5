"""Per-key token buckets shared by the processes of one `gateway --processes N`.

Each process has its own router; with buckets of its own, a key would get up to N times its
`requests_per_min` and `tokens_per_min`, since the kernel spreads connections over the
processes. Here the buckets' state lives in one file that every process maps (MAP_SHARED), in
the private directory the gateway's parent makes: one slot per key id, holding the key's hash,
then capacity, level and last update for its requests bucket and for its tokens bucket.

A process reads or changes slots only while it holds flock on that file, for a few microseconds
per admission and per settlement. flock is released when its holder dies, so a process killed
mid-update cannot wedge the others; and a process that starts again maps the same file and finds
the keys where the fleet left them. Times are time.monotonic(), one clock for every process of
a host. The slots are never freed: key ids come from the keys file, so there are few; a key
that finds the table full keeps buckets of its own process (logged once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

# key hash; requests capacity, level, updated; tokens capacity, level, updated
_SLOT = struct.Struct("<Q6d")
_FIELD = struct.Struct("<d")
DEFAULT_SLOTS = 16_384
REQUESTS, TOKENS = 0, 1  # which bucket of a slot


def _key_hash(key: str) -> int:
    # Never 0: 0 marks a free slot.
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1


class SharedBucketFile:
    """The slots of a shared bucket file. Call `locked()` around every read and write."""

    def __init__(self, path: str | Path, slots: int = DEFAULT_SLOTS) -> None:
        self.path = Path(path)
        self.slots = slots
        size = slots * _SLOT.size
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        with self.locked():  # the first process to open it sizes it; the others find it sized
            if os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)
        self._slot_of: dict[str, int] = {}
        self._warned_full = False

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def slot(self, key: str, requests_per_min: float | None, tokens_per_min: float | None,
             now: float) -> int | None:
        """`key`'s slot, made (its buckets full) if it has none; None when the table is full."""
        known = self._slot_of.get(key)
        if known is not None:
            return known
        wanted = _key_hash(key)
        start = wanted % self.slots
        for probe in range(self.slots):
            index = (start + probe) % self.slots
            found = _SLOT.unpack_from(self._map, index * _SLOT.size)[0]
            if found == wanted:
                self._slot_of[key] = index
                return index
            if found == 0:
                _SLOT.pack_into(self._map, index * _SLOT.size, wanted, requests_per_min or 0.0,
                                requests_per_min or 0.0, now, tokens_per_min or 0.0, tokens_per_min or 0.0, now)
                self._slot_of[key] = index
                return index
        if not self._warned_full:
            self._warned_full = True
            logger.warning("the shared key-limit table (%d keys) is full: keys beyond it are limited per "
                           "gateway process", self.slots)
        return None

    def get(self, slot: int, bucket: int, field: int) -> float:
        """field 0 capacity, 1 level, 2 updated."""
        return _FIELD.unpack_from(self._map, self._offset(slot, bucket, field))[0]

    def set(self, slot: int, bucket: int, field: int, value: float) -> None:
        _FIELD.pack_into(self._map, self._offset(slot, bucket, field), value)

    @staticmethod
    def _offset(slot: int, bucket: int, field: int) -> int:
        return slot * _SLOT.size + 8 + (bucket * 3 + field) * 8


class SharedTokenBucket:
    """A TokenBucket (router/quota/admission.py) whose level lives in a SharedBucketFile slot.

    Same methods and rules; the caller holds the file's lock around each use.
    """

    __slots__ = ("table", "slot", "bucket", "capacity", "rate_per_s", "_clock")

    def __init__(self, table: SharedBucketFile, slot: int, bucket: int, per_min: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table, self.slot, self.bucket = table, slot, bucket
        self.capacity = per_min
        self.rate_per_s = per_min / 60.0
        self._clock = clock

    @property
    def level(self) -> float:
        now = self._clock()
        table, slot, bucket = self.table, self.slot, self.bucket
        level = min(self.capacity, table.get(slot, bucket, 1) + (now - table.get(slot, bucket, 2)) * self.rate_per_s)
        table.set(slot, bucket, 1, level)
        table.set(slot, bucket, 2, now)
        return level

    def wait_for(self, amount: float) -> float:
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def resized(self, per_min: float) -> SharedTokenBucket:
        """The bucket at `per_min`. Every process applies a reload; only the first changes the
        level (keeping what was used, as TokenBucket.resized does), the others find it done."""
        stored = self.table.get(self.slot, self.bucket, 0)
        if stored != per_min:
            level = self.level
            self.table.set(self.slot, self.bucket, 0, per_min)
            self.table.set(self.slot, self.bucket, 1, per_min - (stored - level))
        return SharedTokenBucket(self.table, self.slot, self.bucket, per_min, self._clock)

    @classmethod
    def started(cls, table: SharedBucketFile, slot: int, bucket: int, per_min: float,
                clock: Callable[[], float] = time.monotonic) -> SharedTokenBucket:
        """A view of the slot's bucket; full at `per_min` if the slot never held this bucket (the
        key had the limit off when its slot was made, and a reload turned it on)."""
        if table.get(slot, bucket, 0) == 0:
            table.set(slot, bucket, 0, per_min)
            table.set(slot, bucket, 1, per_min)
            table.set(slot, bucket, 2, clock())
        return cls(table, slot, bucket, per_min, clock)

    def set_level(self, level: float) -> None:
        self.table.set(self.slot, self.bucket, 1, min(self.capacity, level))
        self.table.set(self.slot, self.bucket, 2, self._clock())

    def take(self, amount: float) -> None:
        self.table.set(self.slot, self.bucket, 1, self.level - amount)

    def give(self, amount: float) -> None:
        self.table.set(self.slot, self.bucket, 1, min(self.capacity, self.level + amount))

    @property
    def full(self) -> bool:
        return self.level >= self.capacity
