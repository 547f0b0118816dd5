"""Following one worker's KV-cache events into the router's cache index.

One task per worker whose Info says it streams events (`WorkerInfo.kv_events`). It subscribes
with the last (epoch, sequence) it applied, so a reconnect to the same engine replays what it
missed and a restarted engine (a new epoch) answers with a snapshot that replaces the worker's
entries. A batch out of order makes the index refuse it (`NEEDS_RESYNC`): the follower asks
again from nothing and gets a snapshot, so a lost event never leaves the index drifting.

While the stream is not open and in order the worker is *stale*: the cache-aware policy scores
it by load alone, and routing never waits for the stream. Its entries stay (a reconnect to the
same engine replays the gap) until a snapshot replaces them or the worker leaves the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from vllm_fleet.errors import FleetError, KvEventsUnsupportedError
from vllm_fleet.router.cache.index import ApplyResult, CacheIndex

logger = logging.getLogger(__name__)

# Between attempts to reopen a worker's event stream: short, so a restarted worker's entries are
# replaced within a second of its return; doubled while it stays away, up to the cap.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0


class KvFollower:
    """Keeps `index` in step with one worker's KV-cache events. `fresh` is True while its stream
    is open and every batch so far was applied in order."""

    def __init__(self, address: str, client, index: CacheIndex, model: Callable[[], str | None],
                 *, on_change: Callable[[], None] = lambda: None, on_unsupported: Callable[[], None] = lambda: None) -> None:
        self.address = address
        self._client = client
        self._index = index
        self._model = model
        self._on_change = on_change
        self._on_unsupported = on_unsupported
        self.fresh = False
        self.resyncs = 0        # times it had to start again from a snapshot
        self.reconnects = 0     # times the stream was reopened after it closed or failed
        self._epoch = ""
        self._sequence = 0

    def _set_fresh(self, fresh: bool) -> None:
        if fresh != self.fresh:
            self.fresh = fresh
            logger.info("worker %s: KV-cache events %s", self.address,
                        "in step" if fresh else "stale; scoring it by load alone")
            self._on_change()

    async def run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            try:
                applied = await self._follow_once()
            except asyncio.CancelledError:
                raise
            except KvEventsUnsupportedError as exc:
                # Asking again will not help (events off, or its engine still loading after a
                # restart): the next Info that says it streams events starts a new follower.
                logger.info("worker %s streams no KV-cache events (%s): routing it by load alone", self.address, exc)
                self._set_fresh(False)
                self._on_unsupported()
                return
            except FleetError as exc:
                applied = False
                logger.info("worker %s: KV-cache event stream failed (%s); reopening", self.address, exc)
            except Exception:  # a follower that died would leave the worker stale for good
                applied = False
                logger.exception("worker %s: following KV-cache events failed; reopening", self.address)
            self._set_fresh(False)
            self.reconnects += 1
            delay = RETRY_FIRST_S if applied else min(RETRY_MAX_S, delay * 2)
            await asyncio.sleep(delay)

    async def _follow_once(self) -> bool:
        """One subscription, until it ends, fails or falls out of order; whether any batch applied."""
        applied = False
        model = self._model() or ""
        events = self._client.kv_events(after_sequence=self._sequence, epoch=self._epoch)
        async with contextlib.aclosing(events):
            async for batch in events:
                result = self._index.apply(self.address, batch, model=model)
                if result is ApplyResult.NEEDS_RESYNC:
                    logger.info("worker %s: KV-cache events out of order (epoch %s, sequence %d after %d); "
                                "asking for a snapshot", self.address, batch.epoch, batch.sequence, self._sequence)
                    self._epoch, self._sequence = "", 0
                    self.resyncs += 1
                    return applied
                self._epoch, self._sequence = batch.epoch, batch.sequence
                applied = True
                self._set_fresh(True)
        return applied
