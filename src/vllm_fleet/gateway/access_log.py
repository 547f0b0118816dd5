"""One structured log line per request: who (key id, never the key), what, where, how long."""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field

logger = logging.getLogger("vllm_fleet.gateway.access")

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_from(headers: dict[str, str]) -> tuple[str, bool]:
    """The client's X-Request-Id if it is a sane token, else a new one; and whether it was the client's."""
    given = headers.get("x-request-id")
    if given and _CLIENT_ID.match(given):
        return given, True
    return uuid.uuid4().hex, False


@dataclass(slots=True)
class RequestRecord:
    """What the access log says about one request; handlers fill it in as they learn things."""

    request_id: str
    method: str
    path: str
    client: str
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    key_id: str | None = None
    model: str | None = None
    stream: bool | None = None
    worker: str | None = None
    attempts: int = 0
    migrations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    error: str | None = None

    def emit(self) -> None:
        if not logger.isEnabledFor(logging.INFO):  # building the fields costs more than the check
            return
        duration_ms = (time.perf_counter() - self.started) * 1000
        fields = {
            "request_id": self.request_id, "method": self.method, "path": self.path, "status": self.status,
            "client": self.client, "key_id": self.key_id, "model": self.model, "stream": self.stream,
            "worker": self.worker, "attempts": self.attempts, "migrations": self.migrations,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 2),
            "duration_ms": round(duration_ms, 2), "error": self.error,
        }
        logger.info("%s %s %s %.1fms key=%s model=%s worker=%s tokens=%s/%s", self.method, self.path, self.status,
                    duration_ms, self.key_id, self.model, self.worker, self.prompt_tokens, self.completion_tokens,
                    extra=fields)
