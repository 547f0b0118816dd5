"""/dashboard: a status page of workers, devices, states, load, breakers and request rates.

The page (static/dashboard.html + dashboard.js, no build step) holds no data; it polls
/dashboard/state.json, which needs an admin key when keys are configured. The page takes the
key from the URL fragment (`/dashboard#key=...`, never sent to servers or logs) or a prompt,
and keeps it in sessionStorage.
"""

from __future__ import annotations

import time
from importlib import resources

from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.call import Call
from vllm_fleet.registry import Registry
from vllm_fleet.router import Router

_STATIC = resources.files("vllm_fleet.gateway") / "static"


class Dashboard:
    def __init__(self, router: Router, registry: Registry | None = None, totals: dict[str, int] | None = None) -> None:
        self.router = router
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
        members = self.registry.members() if self.registry is not None else {}
        workers = []
        for view in self.router.snapshot():
            entry = view.to_dict()
            record = members.get(view.address)
            entry["device"] = record.device if record is not None and record.device else ""
            workers.append(entry)
        return Response.json({"time": time.time(), "models": self.router.models(), "workers": workers,
                              "requests": dict(self.totals)},
                             headers=[(b"cache-control", b"no-store")])
