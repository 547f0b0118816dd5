"""Helpers shared by the chaos scenarios (a module, not conftest, so tests can import it)."""

from __future__ import annotations

import json

import httpx

from support import free_port


def metrics_options() -> dict:
    """Worker options that open its Prometheus port; pass the port to `worker_requests`."""
    return {"metrics_port": free_port()}


async def worker_requests(metrics_port: int) -> float:
    """Generate requests the worker has finished, any outcome, from its own Prometheus counter."""
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm_fleet_worker_requests_total{"))


def sse_events(lines: list[str]) -> list[dict | str]:
    """The `data:` payloads of an SSE body: parsed JSON, or the literal '[DONE]'."""
    events: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
