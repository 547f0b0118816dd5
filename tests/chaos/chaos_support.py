"""Helpers shared by the chaos scenarios (a module, not conftest, so tests can import it)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig

from support import free_port


def metrics_options() -> dict:
    """Worker options that open its Prometheus port; pass the port to `worker_requests`."""
    return {"metrics_port": free_port()}


async def worker_requests(metrics_port: int, outcomes: tuple[str, ...] | None = None) -> float:
    """Generate requests the worker has finished (with one of `outcomes`, default any), from its
    own Prometheus counter."""
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm_fleet_worker_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            if outcomes is None or outcome in outcomes:
                total += float(line.rsplit(" ", 1)[1])
    return total


def sse_events(lines: list[str]) -> list[dict | str]:
    """The `data:` payloads of an SSE body: parsed JSON, or the literal '[DONE]'."""
    events: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@dataclass
class StreamResult:
    """One SSE completion stream as the client saw it."""

    text: str = ""
    finish_reason: str | None = None
    error: dict | None = None
    done: bool = False
    status: int = 0
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each data event
    started: float = 0.0

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.started if self.arrivals else None

    @property
    def longest_gap(self) -> float:
        times = [self.started, *self.arrivals]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)


async def stream_completion(http: httpx.AsyncClient, body: dict, *, first_token: asyncio.Event | None = None,
                            headers: dict | None = None) -> StreamResult:
    """POST a streaming /v1/completions and collect it; set `first_token` on the first text event."""
    result = StreamResult(started=time.monotonic())
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}, headers=headers) as reply:
        result.status = reply.status_code
        if reply.status_code != 200:
            await reply.aread()
            return result
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            result.arrivals.append(time.monotonic())
            payload = line[len("data: "):]
            if payload == "[DONE]":
                result.done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                result.error = event["error"]
                continue
            for choice in event.get("choices", []):
                result.text += choice.get("text") or ""
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
            if first_token is not None and result.text:
                first_token.set()
    return result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def router_for(addresses: list[str], config: RouterConfig | None = None) -> Router:
    """A Router over a static list, with its own metrics registry (several may exist at once)."""
    return Router(StaticRegistry.from_spec(",".join(addresses)), config or RouterConfig(),
                  metrics_registry=CollectorRegistry())


def text_request(request_id: str, prompt: str, max_tokens: int) -> GenerateRequest:
    return build_request(request_id=request_id, inputs=[GenerateInput(text=prompt)],
                         params=SamplingParams(max_tokens=max_tokens, ignore_eos=True))


async def collect(stream, first: asyncio.Event | None = None) -> tuple[str, str | None]:
    """(text, finish_reason) of a single-sample RoutedStream; sets `first` on its first chunk."""
    text, finish = "", None
    async for chunk in stream:
        if first is not None:
            first.set()
        text += chunk.text
        finish = chunk.finish_reason or finish
    return text, finish


async def engine_requests(addresses: list[str]) -> int:
    """Requests the workers' engines are running or holding in their queue, from each one's Load."""
    clients = [WorkerClient(address) for address in addresses]
    try:
        loads = await asyncio.gather(*(client.load() for client in clients))
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    return sum(load.running + load.waiting for load in loads)


async def settled_count(measure: Callable[[], Awaitable[int]], *, timeout: float, interval: float = 0.05) -> int:
    """Poll `measure` until it reads 0 or `timeout` seconds pass; the last reading (0 if it settled).

    Like `wait_until`, but a test gets the count to print and assert instead of a timeout error.
    """
    deadline = time.monotonic() + timeout
    while True:
        count = await measure()
        if count == 0 or time.monotonic() > deadline:
            return count
        await asyncio.sleep(interval)
