"""Soak (reliability scenario 14): mixed load through a real gateway process for a long time,
with faults 1-7 on a schedule, sampling the gateway's memory, file descriptors, asyncio tasks,
P99 TTFT and errors by kind.

    nice -n 19 python benchmarks/soak.py                      # 30 minutes, 20 req/s
    nice -n 19 python benchmarks/soak.py --minutes 5 --rate 10 --json /tmp/soak.json

Workers are mock-engine processes (the faults are about the control plane), started, killed
and restarted on their own ports by this script; the gateway is `vllm-fleet gateway` in its own
process so that its RSS and fds are measured alone. Not a test: it asserts nothing and reports
memory growth (linear fit, MB/h), fd and task drift, and P99 TTFT drift (first vs last window).
Errors during a fault are expected (e.g. 503 while all workers are down, 429 for the abusive
key); they are counted by kind and by the fault that was active.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from vllm_fleet.bench import percentile
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.gateway.keys import KeyRecord, hash_key, write_keys
from vllm_fleet.processes import GatewayProcess

MODEL = "soak"
RECOVERY_S = 5.0  # a request within this long after a fault ended is counted as that fault's
KEYS = {"load": "sk-soak-load", "abusive": "sk-soak-abusive", "admin": "sk-soak-admin"}


@dataclass
class Outcome:
    started: float
    kind: str            # chat/completion, stream or not
    result: str          # ok, http_503, http_429, stream_error, transport, abandoned
    ttft: float | None = None
    fault: str = "none"  # the fault active while it ran (or just ended: see RECOVERY_S)
    message: str = ""    # the error message, for unexpected kinds
    ended: float = 0.0


@dataclass
class Soak:
    args: argparse.Namespace
    workers: list[WorkerProcess] = field(default_factory=list)
    gateway: GatewayProcess | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    faults_run: list[tuple[float, float, str]] = field(default_factory=list)  # start, end (monotonic), name
    t0: float = 0.0

    # ---- processes -------------------------------------------------------------------------
    async def start(self, tmp: Path) -> None:
        worker_args = ["--engine", "mock", "--served-model-name", MODEL, "--mock-tokens-per-s",
                       str(self.args.tokens_per_s), "--mock-ttft-ms", "20"]
        self.workers = [WorkerProcess(worker_args, {"VLLM_FLEET_LOG_LEVEL": "WARNING"}).start()
                        for _ in range(self.args.workers)]
        for worker in self.workers:
            await worker.wait_serving(60)
        keys = tmp / "keys.jsonl"
        write_keys(keys, [KeyRecord("load", hash_key(KEYS["load"])),
                          KeyRecord("abusive", hash_key(KEYS["abusive"]), limits={"requests_per_min": 60}),
                          KeyRecord("admin", hash_key(KEYS["admin"]), admin=True)])
        self.gateway = GatewayProcess(
            ["--workers", ",".join(w.address for w in self.workers), "--api-key-file", str(keys),
             "--no-access-log", "--health-poll-interval-s", "0.5", "--stall-timeout-s", "3",
             "--retry-budget-min-per-s", "20", "--short-max-in-flight", "64", "--short-queue-size", "128"],
            {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, log_path=tmp / "gateway.log").start()
        await self.gateway.wait_ready(60)

    @property
    def url(self) -> str:
        return self.gateway.url if self.gateway else ""

    def stop(self) -> None:
        for worker in self.workers:
            worker.kill()
        if self.gateway is not None:
            self.gateway.stop(grace_s=30)

    async def restart(self, index: int) -> None:
        """kill -9 and start again on the same port (a restarted process, as a supervisor would)."""
        worker = self.workers[index]
        worker.kill()
        worker.start()
        await worker.wait_serving(60)

    # ---- load --------------------------------------------------------------------------------
    async def request(self, http: httpx.AsyncClient, rng: random.Random, key: str = "load") -> None:
        chat, stream = rng.random() < 0.6, rng.random() < 0.7
        kind = ("chat" if chat else "completion") + ("-stream" if stream else "")
        body: dict = {"model": MODEL, "max_tokens": rng.randint(8, 48), "stream": stream}
        headers = {"Authorization": f"Bearer {KEYS[key]}"}
        if chat:
            body["messages"] = [{"role": "user", "content": f"question {rng.random():.6f}"}]
            if rng.random() < 0.3:
                headers["X-Session-Id"] = f"session-{rng.randint(0, 50)}"
        else:
            body["prompt"] = f"complete {rng.random():.6f}"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        outcome = Outcome(time.monotonic(), kind if key == "load" else "abusive", "ok")
        try:
            if not stream:
                reply = await http.post(path, json=body, headers=headers)
                if reply.status_code != 200:
                    outcome.result, outcome.message = f"http_{reply.status_code}", reply.text[:200]
            else:
                async with http.stream("POST", path, json=body, headers=headers) as reply:
                    if reply.status_code != 200:
                        outcome.message = (await reply.aread()).decode(errors="replace")[:200]
                        outcome.result = f"http_{reply.status_code}"
                    else:
                        async for line in reply.aiter_lines():
                            if outcome.ttft is None and line.startswith("data: {") and '"error"' not in line:
                                outcome.ttft = time.monotonic() - outcome.started
                            if line.startswith("data: {") and '"error"' in line[:20]:
                                outcome.result, outcome.message = "stream_error", line[:200]
        except httpx.HTTPError as exc:
            outcome.result = f"transport_{type(exc).__name__}"
        self.record(outcome)

    def record(self, outcome: Outcome) -> None:
        outcome.ended = time.monotonic()
        self.outcomes.append(outcome)

    async def abandon(self, http: httpx.AsyncClient) -> None:
        """A client that leaves after its first token (fault 7)."""
        body = {"model": MODEL, "prompt": "abandon me", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        outcome = Outcome(time.monotonic(), "abandon", "abandoned")
        try:
            async with http.stream("POST", "/v1/completions", json=body,
                                   headers={"Authorization": f"Bearer {KEYS['load']}"}) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        break
        except httpx.HTTPError as exc:
            outcome.result = f"transport_{type(exc).__name__}"
        self.record(outcome)

    async def load(self, http: httpx.AsyncClient, until: float) -> None:
        """Open-loop Poisson arrivals at --rate req/s."""
        rng = random.Random(1)
        tasks: set[asyncio.Task] = set()
        next_at = time.monotonic()
        while next_at < until:
            next_at += rng.expovariate(self.args.rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task = asyncio.ensure_future(self.request(http, rng))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- faults ------------------------------------------------------------------------------
    async def run_fault(self, number: int, http: httpx.AsyncClient) -> None:
        victim = number % len(self.workers)
        name = ["kill-9", "refuse", "sigstop", "flap", "all-down", "overload", "disconnects"][number % 7]
        started = time.monotonic()
        print(f"[soak] {time.monotonic() - self.t0:6.0f} s  fault: {name} (worker {victim})", flush=True)
        try:
            if name == "kill-9":        # 1: kill -9 under load, restart at once
                await self.restart(victim)
            elif name == "refuse":      # 2: port closed for 15 s (connections refused)
                self.workers[victim].kill()
                await asyncio.sleep(15)
                await self.restart(victim)
            elif name == "sigstop":     # 3: hung with the process alive for 15 s
                self.workers[victim].signal(signal.SIGSTOP)
                await asyncio.sleep(15)
                self.workers[victim].signal(signal.SIGCONT)
            elif name == "flap":        # 4: killed and restarted 3 times
                for _ in range(3):
                    await self.restart(victim)
                    await asyncio.sleep(2)
            elif name == "all-down":    # 5: every worker down for 5 s
                for worker in self.workers:
                    worker.kill()
                await asyncio.sleep(5)
                await asyncio.gather(*(self.restart(i) for i in range(len(self.workers))))
            elif name == "overload":    # 6: an abusive key bursts 150 requests in ~3 s
                rng = random.Random(number)
                burst = []
                for _ in range(150):
                    burst.append(asyncio.ensure_future(self.request(http, rng, key="abusive")))
                    await asyncio.sleep(0.02)
                await asyncio.gather(*burst)
            elif name == "disconnects":  # 7: 20 clients leave after their first token
                await asyncio.gather(*(self.abandon(http) for _ in range(20)))
        finally:
            self.faults_run.append((started, time.monotonic(), name))

    async def faults(self, http: httpx.AsyncClient, until: float) -> None:
        number = 0
        while True:
            at = self.t0 + self.args.first_fault_s + number * self.args.fault_every_s
            if at >= until - 10:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            await self.run_fault(number, http)
            number += 1

    # ---- sampling ----------------------------------------------------------------------------
    async def sample(self, admin: httpx.AsyncClient, since: float) -> None:
        pid = self.gateway.pid
        rss_kb = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        tasks = None
        try:
            text = (await admin.get("/metrics")).text
            tasks = next(float(line.split()[1]) for line in text.splitlines()
                         if line.startswith("vllm_fleet_gateway_asyncio_tasks "))
        except (httpx.HTTPError, StopIteration):
            pass
        window = [o for o in self.outcomes if o.started >= since]
        ttfts = [o.ttft for o in window if o.ttft is not None and o.result == "ok"]
        errors = Counter(o.result for o in window if o.result not in ("ok", "abandoned"))
        sample = {"t_s": round(time.monotonic() - self.t0, 1), "rss_mb": round(rss_kb / 1024, 1), "fds": fds,
                  "tasks": tasks, "requests": len(window), "p99_ttft_ms": _p99_ms(ttfts),
                  "errors": dict(errors)}
        self.samples.append(sample)
        print(f"[soak] {sample['t_s']:6.0f} s  rss {sample['rss_mb']:6.1f} MB  fds {fds:4d}  tasks {tasks}  "
              f"requests {len(window):5d}  P99 TTFT {sample['p99_ttft_ms']} ms  errors {dict(errors)}", flush=True)

    async def sampler(self, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10,
                                     headers={"Authorization": f"Bearer {KEYS['admin']}"}) as admin:
            since = time.monotonic()
            await self.sample(admin, since)
            while time.monotonic() < until:
                await asyncio.sleep(min(self.args.sample_s, max(0.0, until - time.monotonic())))
                now = time.monotonic()
                await self.sample(admin, since)
                since = now

    async def run(self) -> dict:
        with tempfile.TemporaryDirectory(prefix="vllm-fleet-soak-") as tmp:
            try:
                await self.start(Path(tmp))
                self.t0 = time.monotonic()
                until = self.t0 + self.args.minutes * 60
                limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
                async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as http:
                    await asyncio.gather(self.load(http, until), self.faults(http, until), self.sampler(until))
                # Let the pool settle, then take a last sample with nothing in flight.
                await asyncio.sleep(2)
                async with httpx.AsyncClient(base_url=self.url, timeout=10,
                                             headers={"Authorization": f"Bearer {KEYS['admin']}"}) as admin:
                    await self.sample(admin, time.monotonic())
                    self.samples[-1]["idle"] = True
            finally:
                self.stop()
        return self.summary()

    def attribute(self) -> None:
        """Label each request with the fault active at any time while it ran (or that ended less
        than RECOVERY_S before it started); of several, the latest to start."""
        for o in self.outcomes:
            overlapping = [(start, name) for start, end, name in self.faults_run
                           if o.started <= end + RECOVERY_S and o.ended >= start]
            if overlapping:
                o.fault = max(overlapping)[1]  # the latest one to start

    def summary(self) -> dict:
        self.attribute()
        live = [s for s in self.samples if not s.get("idle")]
        warm = [s for s in live if s["t_s"] >= self.args.warmup_s] or live
        slope_mb_per_s = _slope([s["t_s"] for s in warm], [s["rss_mb"] for s in warm])
        by_kind = Counter(o.result for o in self.outcomes)
        by_fault: dict[str, Counter] = {}
        for o in self.outcomes:
            if o.result not in ("ok", "abandoned"):
                by_fault.setdefault(o.fault, Counter())[o.result] += 1
        windows = [s for s in live[1:] if s["p99_ttft_ms"] is not None]
        messages = Counter(f"{o.result} during {o.fault}: {o.message}" for o in self.outcomes
                           if o.message and o.result not in ("http_429", "http_503"))
        return {
            "minutes": self.args.minutes, "rate": self.args.rate, "workers": self.args.workers,
            "requests": len(self.outcomes), "results": dict(by_kind),
            "errors_by_fault": {k: dict(v) for k, v in by_fault.items()},
            "errors_outside_faults": sum(by_fault.get("none", Counter()).values()),
            "faults": [f"{start - self.t0:.0f}-{end - self.t0:.0f}s {n}" for start, end, n in self.faults_run],
            "other_error_messages": dict(messages.most_common(10)),
            "rss_mb_first_last_max": [warm[0]["rss_mb"], warm[-1]["rss_mb"], max(s["rss_mb"] for s in live)],
            "rss_growth_mb_per_h": round(slope_mb_per_s * 3600, 2),
            "fds_first_last_max": [live[0]["fds"], self.samples[-1]["fds"], max(s["fds"] for s in self.samples)],
            "tasks_first_last_max": [live[0]["tasks"], self.samples[-1]["tasks"],
                                     max((s["tasks"] or 0) for s in self.samples)],
            "p99_ttft_ms_first_last_window": [windows[0]["p99_ttft_ms"], windows[-1]["p99_ttft_ms"]] if windows else None,
            "samples": self.samples,
        }


def _p99_ms(values: list[float]) -> float | None:
    return round(percentile(values, 99) * 1000, 1) if values else None


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs (0 with fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30, help="How long the load runs")
    parser.add_argument("--rate", type=float, default=20, help="Requests per second (Poisson arrivals)")
    parser.add_argument("--workers", type=int, default=3, help="Mock workers")
    parser.add_argument("--tokens-per-s", type=float, default=200, help="Mock engine tokens/s per sequence")
    parser.add_argument("--sample-s", type=float, default=30, help="Seconds between samples")
    parser.add_argument("--first-fault-s", type=float, default=60, help="When the first fault starts")
    parser.add_argument("--fault-every-s", type=float, default=75, help="Seconds between fault starts")
    parser.add_argument("--warmup-s", type=float, default=60, help="Samples before this are left out of the memory fit")
    parser.add_argument("--json", help="Also write the summary and every sample to this file")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_FLEET_LOG_LEVEL", "WARNING")
    summary = asyncio.run(Soak(args).run())
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    shown = {k: v for k, v in summary.items() if k != "samples"}
    print("\n[figure] soak: " + json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
