"""Two-worker, routed version of stall_arrivals.py (#28): the victim stalls, arrivals must be answered elsewhere.

Shared by tests/chaos/test_stall_arrivals.py (one case, in CI) and benchmarks/stall_arrivals.py
(detection time against the arrival rate and prompt length). A router spreads four long streams
over two real workers, a fresh victim and a healthy one; SIGSTOP of the victim's EngineCore
process (only it: its model-runner child stays awake, polling for work, as it would behind a
wedged EngineCore) stalls the victim's streams while its gRPC loop stays alive. From then until
the victim says NOT_SERVING, new requests arrive through the router at `rate_per_s`, each a
prompt of about `prompt_words` words; the router sends about half of them to the victim, whose
worker process renders and tokenizes them. Detection time: from the SIGSTOP to the victim saying
NOT_SERVING (or exiting), as a client polling its health every 0.1 s sees it. Then every stream
is followed to its end: each long stream must carry exactly its tokens (migrated, none lost or
repeated), and each arrival must be answered, by the healthy worker.

The victim runs with DEBUG logs, so its log holds the watch's per-check decision lines
(src/vllm_fleet/worker/watch/decision_log.py) and its own verdict (silence and bound).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from chaos_support import router_for, text_request
from stall_arrivals import said_stalled
from support import WorkerProcess, vllm_worker_args, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.router import RouterConfig

STREAMS = 4
STREAM_TOKENS = 160
ARRIVAL_TOKENS = 8
_VERDICT = re.compile(r"engine stalled: .* no output for ([\d.]+)s \(bound ([\d.]+)s")


@dataclass
class Answer:
    """One stream as its client saw it."""

    request_id: str
    tokens: int = 0
    finish: str | None = None
    error: Exception | None = None
    worker: str | None = None     # the worker that finished it
    attempts: int = 0             # workers it was sent to


@dataclass
class StallOutcome:
    detection_s: float
    arrivals: list[Answer] = field(default_factory=list)
    long_streams: list[Answer] = field(default_factory=list)
    on_victim: int = 0            # long streams the victim held at the stop
    worker_silent_s: float | None = None   # the victim's own verdict, from its log
    worker_bound_s: float | None = None
    exit_code: int | None = None
    victim: str = ""
    healthy: str = ""

    @property
    def failed(self) -> list[Answer]:
        return [a for a in self.long_streams + self.arrivals if a.error is not None]

    @property
    def answered_elsewhere(self) -> int:
        return sum(1 for a in self.arrivals if a.error is None and a.worker == self.healthy
                   and a.tokens == ARRIVAL_TOKENS)

    @property
    def sent_to_victim_first(self) -> int:
        return sum(1 for a in self.arrivals if a.attempts > 1)


def engine_cores(worker_pid: int) -> list[psutil.Process]:
    children = psutil.Process(worker_pid).children(recursive=True)
    return [p for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]


async def _follow(stream, answer: Answer, progress: list[int] | None = None) -> Answer:
    try:
        async for chunk in stream:
            answer.tokens += len(chunk.token_ids)
            answer.finish = chunk.finish_reason or answer.finish
            if progress is not None:
                progress.append(len(chunk.token_ids))
    except Exception as exc:   # a failed stream: counted, never hidden
        answer.error = exc
    answer.worker, answer.attempts = stream.worker, stream.attempts
    return answer


async def stall_with_arrivals(healthy_address: str, rate_per_s: float, prompt_words: int, *,
                              victim_cores: str = "1", log_path: str | Path | None = None) -> StallOutcome:
    args, env = vllm_worker_args(victim_cores)
    victim = WorkerProcess(args, {**env, "VLLM_FLEET_LOG_LEVEL": "DEBUG"}, log_path=log_path).start()
    tasks: list[asyncio.Task] = []
    try:
        await victim.wait_serving(600)
        routing = RouterConfig(policy="round_robin", health_poll_interval_s=0.5, load_poll_interval_s=0.5)
        async with router_for([victim.address, healthy_address], routing) as router, \
                WorkerClient(victim.address) as victim_client:
            await wait_until(lambda: len(router.snapshot().eligible()) == 2, timeout=60, message="both in rotation")
            progress: list[list[int]] = [[] for _ in range(STREAMS)]
            streams = [router.stream(text_request(f"long-{i}", f"Tell story number {i}.", STREAM_TOKENS))
                       for i in range(STREAMS)]
            long_streams = [asyncio.create_task(_follow(s, Answer(f"long-{i}"), progress[i]))
                            for i, s in enumerate(streams)]
            tasks += long_streams
            await wait_until(lambda: all(sum(p) >= 4 for p in progress), timeout=300, message="every stream decoding")
            assert not any(t.done() for t in long_streams), "streams finished before the stop: make them longer"
            on_victim = sum(1 for s in streams if s.worker == victim.address)
            assert on_victim, "the victim holds no long stream"
            cores = engine_cores(victim.pid)
            assert cores, "no EngineCore process under the victim"
            for core in cores:
                os.kill(core.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            prompt = " ".join(["word"] * prompt_words)
            arrivals: list[asyncio.Task] = []
            detected_at: float | None = None

            async def arrive() -> None:
                while rate_per_s > 0 and detected_at is None:
                    rid = f"new-{len(arrivals)}"
                    stream = router.stream(text_request(rid, prompt, ARRIVAL_TOKENS))
                    arrivals.append(asyncio.create_task(_follow(stream, Answer(rid))))
                    await asyncio.sleep(1 / rate_per_s)   # pacing the load, not synchronisation

            arriving = asyncio.create_task(arrive())
            tasks.append(arriving)

            await wait_until(lambda: said_stalled(victim, victim_client), timeout=120, interval=0.1,
                             message="the stall detected")
            detected_at = time.monotonic()
            await arriving
            tasks += arrivals
            answers = await asyncio.wait_for(asyncio.gather(*long_streams, *arrivals), timeout=600)
            outcome = StallOutcome(detected_at - stopped_at, arrivals=list(answers[STREAMS:]),
                                   long_streams=list(answers[:STREAMS]), on_victim=on_victim,
                                   exit_code=victim.returncode, victim=victim.address, healthy=healthy_address)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        victim.kill()   # its process group: the stopped EngineCore with it
    verdict = _VERDICT.search(Path(victim.log_path).read_text(errors="replace"))
    if verdict:
        outcome.worker_silent_s, outcome.worker_bound_s = float(verdict[1]), float(verdict[2])
    return outcome
