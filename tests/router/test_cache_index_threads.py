"""The index is read from decision threads while the event loop notes routes and applies events
(router/stream.py decides off the loop): every call must see and leave a consistent index.

Without the index's lock, two lookups expiring the same speculative entry raced, and one of
them failed its request with a KeyError (H200 run of workload (a), 2026-12-04)."""

from __future__ import annotations

import sys
import threading

import pytest

from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.index import CacheIndex

BLOCK = 16


@pytest.fixture
def tiny_switch_interval():
    # Switch threads every microsecond, so the interleavings a busy router meets come fast.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_lookups_from_threads_while_routes_expire(tiny_switch_interval) -> None:
    now = [0.0]
    index = CacheIndex(clock=lambda: now[0])
    prompts = [block_keys(list(range(p * 1000, p * 1000 + 40 * BLOCK)), BLOCK) for p in range(20)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def look_up() -> None:
        try:
            while not stop.is_set():
                for keys in prompts:
                    index.matched_tokens("m", keys)
        except BaseException as exc:  # noqa: BLE001 - any failure of a lookup is the finding
            errors.append(exc)

    readers = [threading.Thread(target=look_up, daemon=True) for _ in range(3)]
    for reader in readers:
        reader.start()
    rounds = 0
    while rounds < 200 and not errors:
        for n, keys in enumerate(prompts):
            hold = index.note_routed(f"w{n % 2}", "m", keys, ttl_s=1.0)
            hold.first_token()            # its entries now expire one ttl later
        now[0] += 2.0                      # ... which has passed: the next lookups expire them
        rounds += 1
    stop.set()
    for reader in readers:
        reader.join(timeout=10)
    assert not errors, f"a lookup failed while routes expired: {errors[0]!r}"
    # Everything noted has expired: nothing may be left counted, on any worker.
    now[0] += 2.0
    assert index.matched_tokens("m", prompts[0]) == {}
    assert len(index) == 0
    assert all(count == 0 for count in index.entries_per_worker().values())
