"""A worker of the previous release (request form 0) would run this router's requests with the
client's n dropped and default sampling (it reads the old typed copy, which is no longer sent), so
the pool keeps it out of routing, says why once, and takes it when it is upgraded."""

from __future__ import annotations

import logging

from fakes import FakeClock, ScriptedWorkerClient, serving_pool
from support import wait_until
from vllm_fleet.protocol.types import REQUEST_FORM


async def test_a_worker_of_an_older_request_form_gets_no_requests_until_it_is_upgraded(caplog):
    worker = ScriptedWorkerClient("old:1")
    worker.request_form = 0
    caplog.set_level(logging.ERROR, logger="vllm_fleet.router.pool.membership")
    pool = await serving_pool(worker, FakeClock(), 0.02)
    try:
        await wait_until(lambda: worker.info_calls >= 3, timeout=5, message="Info asked again")
        assert [view.address for view in pool.snapshot() if view.routable] == []
        refusals = [r for r in caplog.records if "request form 0" in r.getMessage()]
        assert len(refusals) == 1 and "upgrade the worker" in refusals[0].getMessage()
        worker.request_form = REQUEST_FORM  # the same address, restarted on this release
        await wait_until(lambda: [v.address for v in pool.snapshot() if v.routable] == ["old:1"], timeout=5,
                         message="the upgraded worker routable")
    finally:
        await pool.close()
