"""/dashboard: a status page of workers, devices, states, load, breakers and request rates.

The page (static/dashboard.html + dashboard.js, no build step) holds no data; it polls
/dashboard/state.json, which needs an admin key when keys are configured. The page takes the
key from the URL fragment (`/dashboard#key=...`, never sent to servers or logs) or a prompt,
and keeps it in sessionStorage.

With `--processes N` the state answers for all N processes: request totals and each worker's
in-flight requests and outstanding tokens add up over them, and so do batch requests waiting
for slack (with the reason of the one waiting longest), and `cache_index` lists every process's
cache-index counters (cache_aware: events applied, resyncs, malformed events, speculative entries,
entries per worker); the rest (worker states, breakers, Load) is the answering process's view.
"""

from __future__ import annotations

import json
import time
from importlib import resources

from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.siblings import Siblings
from vllm_fleet.registry import Registry
from vllm_fleet.router import Router

_STATIC = resources.files("vllm_fleet.gateway") / "static"


class Dashboard:
    def __init__(self, router: Router, registry: Registry | None = None, totals: dict[str, int] | None = None,
                 siblings: Siblings | None = None) -> None:
        self.router = router
        self.siblings = siblings
        self.registry = registry
        self.totals = totals if totals is not None else {}
        self._page = Response(200, (_STATIC / "dashboard.html").read_bytes(), b"text/html; charset=utf-8",
                              [(b"cache-control", b"no-cache")])
        self._script = Response(200, (_STATIC / "dashboard.js").read_bytes(), b"text/javascript; charset=utf-8",
                                [(b"cache-control", b"no-cache")])

    async def page(self, call: Call) -> Response:
        return self._page

    async def script(self, call: Call) -> Response:
        return self._script

    async def state(self, call: Call) -> Response:
        state = self.own_state()
        if self.siblings is not None:
            others = [json.loads(answer) for answer in await self.siblings.ask("state")]
            state = merge_states(state, others, processes=self.siblings.processes)
        return Response.json(state, headers=[(b"cache-control", b"no-store")])

    def own_state(self) -> dict:
        """This process's view: its router's workers and its own request totals."""
        members = self.registry.members() if self.registry is not None else {}
        workers = []
        for view in self.router.snapshot():
            entry = view.to_dict()
            record = members.get(view.address)
            entry["device"] = record.device if record is not None and record.device else ""
            workers.append(entry)
        # The cache index's counters (cache_aware only): resyncs, expiries, malformed events, entries.
        # A list, one per gateway process, since each keeps its own index.
        cache_index = self.router.cache_stats()
        return {"time": time.time(), "models": self.router.models(), "workers": workers,
                "requests": dict(self.totals), "batch_waiting": self.router.batch_wait_status().to_dict(),
                "cache_index": [cache_index] if cache_index else []}

    async def own_state_bytes(self) -> bytes:
        return json.dumps(self.own_state()).encode()


_SUMMED_WORKER_FIELDS = ("in_flight", "outstanding_tokens", "batch_in_flight", "interactive_in_flight")


def merge_states(own: dict, others: list[dict], *, processes: int) -> dict:
    """`own` with the request totals and per-worker counts of `others` added in."""
    merged = {**own, "requests": dict(own["requests"]), "workers": [dict(w) for w in own["workers"]]}
    by_address = {w["address"]: w for w in merged["workers"]}
    for other in others:
        for name, count in other.get("requests", {}).items():
            merged["requests"][name] = merged["requests"].get(name, 0) + count
        for worker in other.get("workers", []):
            mine = by_address.get(worker["address"])
            if mine is not None:
                for name in _SUMMED_WORKER_FIELDS:
                    mine[name] = mine.get(name, 0) + worker.get(name, 0)
    # Batch waiting for slack: every process's requests; the reason of the one waiting longest.
    waits = [w for w in (own.get("batch_waiting"), *(o.get("batch_waiting") for o in others)) if w and w["waiting"]]
    if waits:
        longest = max(waits, key=lambda w: w["waited_s"])
        merged["batch_waiting"] = {**longest, "waiting": sum(w["waiting"] for w in waits)}
    merged["cache_index"] = [stats for state in (own, *others) for stats in state.get("cache_index", [])]
    merged["processes"] = {"serving": processes, "answered": 1 + len(others)}
    return merged
