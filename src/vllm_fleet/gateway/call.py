"""One HTTP call as every route handler sees it, and the one handler signature.

    async def handler(call: Call) -> Response | StreamResponse

`app.py` builds the Call after routing and authentication, so a handler never authenticates
and never learns how it was reached; the routes table maps (method, path) to (auth need,
handler) and nothing else.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.gateway.asgi import HttpRequest, Response, StreamResponse

# Who may call a route: anyone, any valid key, or an admin key (all open when keys are off).
AuthNeed = Literal["none", "key", "admin"]


@dataclass(frozen=True, slots=True)
class Call:
    http: HttpRequest
    record: RequestRecord       # the access-log line; handlers fill in what they learn
    key_id: str | None          # the authenticated key's id; None when keys are off or not needed
    worker_request_id: str      # unique per call, even when a client repeats its X-Request-Id


Handler = Callable[[Call], Awaitable[Response | StreamResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    need: AuthNeed
    handler: Handler


def worker_request_id(request_id: str, from_client: bool) -> str:
    """Ids from clients may repeat; the worker needs a unique one to abort the right request."""
    return f"{request_id}-{secrets.token_hex(4)}" if from_client else request_id
