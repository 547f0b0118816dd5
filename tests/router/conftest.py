"""Fixtures of the router unit tests."""

from __future__ import annotations

import pytest

from fakes import POOL_WORKER, FakeClock, ScriptedWorkerClient, serving_pool


@pytest.fixture
async def scripted_pool():
    """(pool, worker, clock): a Pool of one scripted worker (POOL_WORKER), polling every 20 ms."""
    worker = ScriptedWorkerClient(POOL_WORKER)
    clock = FakeClock()
    pool = await serving_pool(worker, clock, 0.02)
    yield pool, worker, clock
    await pool.close()
