"""The Router against real worker processes running the mock engine.

The mock engine is deterministic (each token depends only on the two before it), so a stream
that failed over or migrated must equal, token for token and character for character, the
same request answered by one worker without interruption.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import asynccontextmanager

import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    NoWorkerError,
    RateLimitedError,
    UnknownModelError,
)
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import AdmissionConfig, KeyLimits, Router, RouterConfig

# Fast polling so that tests wait on conditions for fractions of a second, not seconds.
FAST = dict(load_poll_interval_s=0.2, health_poll_interval_s=0.2, stall_timeout_s=1.0, first_chunk_timeout_s=5.0)


@asynccontextmanager
async def routed(*addresses: str, **config):
    metrics = CollectorRegistry()
    registry = StaticRegistry([WorkerRecord(address=a) for a in addresses])
    router = Router(registry, RouterConfig(**{**FAST, **config}), metrics_registry=metrics)
    await router.start()
    try:
        await router.wait_ready(timeout=30)
        await wait_until(lambda: len(router.snapshot().eligible()) == len(addresses), timeout=30,
                         message="every worker serving")
        router.metrics = metrics  # for assertions
        yield router
    finally:
        await router.close()


def request(rid: str, prompt: str, max_tokens: int, *, n: int = 1, inputs: int = 1, interval_ms: int = 0,
            session: str = "") -> GenerateRequest:
    items = [GenerateInput(text=f"{prompt} input {i}") for i in range(inputs)]
    return build_request(rid, items, SamplingParams(max_tokens=max_tokens, n=n), session_id=session,
                           stream_interval_ms=interval_ms)


class Collected:
    """Everything one routed stream delivered, per (index, sample)."""

    def __init__(self) -> None:
        self.tokens: dict[tuple[int, int], list[int]] = {}
        self.text: dict[tuple[int, int], str] = {}
        self.finals: dict[tuple[int, int], object] = {}
        self.stream = None

    def add(self, chunk) -> None:
        key = (chunk.index, chunk.sample)
        assert key not in self.finals, f"chunk after the final chunk of {key}"
        self.tokens.setdefault(key, []).extend(chunk.token_ids)
        self.text[key] = self.text.get(key, "") + chunk.text
        if chunk.finish_reason:
            self.finals[key] = chunk

    @property
    def received(self) -> int:
        return sum(len(t) for t in self.tokens.values())


async def consume(router: Router, req: GenerateRequest, into: Collected, **kwargs) -> Collected:
    stream = router.stream(req, **kwargs)
    into.stream = stream
    async with stream:
        async for chunk in stream:
            into.add(chunk)
    return into


async def reference(address: str, req: GenerateRequest) -> Collected:
    """The same request straight from one worker, uninterrupted."""
    out = Collected()
    async with WorkerClient(address) as client:
        async for chunk in client.generate(req, timeout=120):
            out.add(chunk)
    return out


def assert_same_output(got: Collected, want: Collected) -> None:
    assert set(got.finals) == set(want.finals)
    for key in want.finals:
        assert got.tokens[key] == want.tokens[key], f"tokens of {key} differ (lost or repeated)"
        assert got.text[key] == want.text[key], f"text of {key} differs"
        assert got.finals[key].usage.completion_tokens == len(want.tokens[key])
        assert got.finals[key].usage.prompt_tokens == want.finals[key].usage.prompt_tokens


def counter(router: Router, name: str, **labels) -> float:
    return router.metrics.get_sample_value(f"vllm_fleet_router_{name}_total", labels) or 0.0


@pytest.fixture
async def two_workers(mock_worker_factory):
    workers = await mock_worker_factory.start_many(2, mock_tokens_per_s=100, mock_ttft_ms=5)  # together: ~7 s of imports each
    yield workers
    for worker in workers:
        worker.signal(signal.SIGCONT)
        worker.stop(timeout=10)


async def test_routed_stream_equals_the_workers_own_output(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        assert router.models() == ["mock-model"]
        assert router.model_info("mock-model").max_model_len > 0
        req = request("plain", "the quick brown fox", 20, n=2, inputs=2)
        got = await consume(router, req, Collected())
        assert got.stream.attempts == 1 and got.stream.migrations == 0
        assert got.stream.worker in (a.address, b.address)
        assert_same_output(got, await reference(a.address, req))
        snapshot = router.snapshot()
        assert all(w.in_flight == 0 and w.outstanding_tokens == 0 for w in snapshot)
        for address in (a.address, b.address):  # per-worker gauges for the gateway's /metrics
            labels = {"worker": address}
            assert router.metrics.get_sample_value("vllm_fleet_router_worker_serving", labels) == 1
            assert router.metrics.get_sample_value("vllm_fleet_router_breaker_state", labels) == 0
            assert router.metrics.get_sample_value("vllm_fleet_router_in_flight", labels) == 0
        assert counter(router, "requests", model="mock-model", outcome="ok") == 1


async def test_kill_9_under_load_every_stream_completes_without_lost_or_repeated_tokens(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        requests = [request(f"load-{i}", f"prompt number {i} about rivers", 200, interval_ms=50,
                            n=2 if i % 4 == 0 else 1, inputs=2 if i % 5 == 0 else 1) for i in range(12)]
        results = [Collected() for _ in requests]
        tasks = [asyncio.create_task(consume(router, r, c)) for r, c in zip(requests, results)]
        # Kill only once streams on the victim have delivered tokens: they must migrate.
        await wait_until(lambda: all(c.received >= 4 for c in results), timeout=60, message="all streams under way")
        on_victim = [c for c in results if c.stream.worker == a.address]
        assert on_victim, "the policy spread no stream onto the first worker"
        a.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        wanted = await asyncio.gather(*(reference(b.address, r) for r in requests))
        for got, want in zip(results, wanted):
            assert_same_output(got, want)
        assert all(c.stream.migrations >= 1 and c.stream.worker == b.address for c in on_victim)
        assert counter(router, "migrations") >= len(on_victim)
        await wait_until(lambda: router.snapshot().get(a.address).state == "down", timeout=10,
                         message="dead worker out of rotation")


async def test_stalled_worker_is_detected_and_its_streams_migrate(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        requests = [request(f"stall-{i}", f"stall prompt {i}", 150, interval_ms=50) for i in range(6)]
        results = [Collected() for _ in requests]
        tasks = [asyncio.create_task(consume(router, r, c)) for r, c in zip(requests, results)]
        await wait_until(lambda: all(c.received >= 4 for c in results), timeout=60, message="all streams under way")
        on_victim = [c for c in results if c.stream.worker == a.address]
        a.signal(signal.SIGSTOP)
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
            wanted = await asyncio.gather(*(reference(b.address, r) for r in requests))
            for got, want in zip(results, wanted):
                assert_same_output(got, want)
            assert all(c.stream.migrations >= 1 for c in on_victim)
            await wait_until(lambda: router.snapshot().get(a.address).state != "serving", timeout=10,
                             message="stalled worker out of rotation")
            for i in range(4):  # no new traffic to it
                got = await consume(router, request(f"after-{i}", "fresh prompt", 5), Collected())
                assert got.stream.worker == b.address and got.stream.attempts == 1
        finally:
            a.signal(signal.SIGCONT)
        await wait_until(lambda: router.snapshot().get(a.address).state == "serving", timeout=30,
                         message="resumed worker back in rotation")


async def test_failover_before_the_first_token_when_a_worker_is_too_slow(mock_worker_factory):
    slow, fast = await asyncio.gather(mock_worker_factory.start(mock_ttft_ms=20_000),
                                      mock_worker_factory.start(mock_tokens_per_s=200, mock_ttft_ms=5))
    try:
        async with routed(slow.address, fast.address, policy="round_robin", first_chunk_timeout_s=0.5,
                          breaker_failures=1, breaker_open_s=600) as router:
            req = request("failover", "a slow start", 10)
            outs = [await consume(router, req, Collected()) for _ in range(2)]  # round robin: one starts on slow
            assert sorted(c.stream.attempts for c in outs) == [1, 2]
            for got in outs:
                assert got.stream.worker == fast.address and got.stream.migrations == 0
                assert_same_output(got, await reference(fast.address, req))
            assert counter(router, "failovers") == 1
            # Health still says SERVING, but the breaker took the slow worker out of rotation.
            slow_view = router.snapshot().get(slow.address)
            assert slow_view.health == "SERVING" and slow_view.breaker == "open"
            for i in range(4):
                got = await consume(router, request(f"next-{i}", "after the breaker", 3), Collected())
                assert got.stream.attempts == 1 and got.stream.worker == fast.address
    finally:
        slow.stop(timeout=10)
        fast.stop(timeout=10)


async def running(address: str) -> int:
    async with WorkerClient(address) as client:
        return (await client.load()).running


async def test_client_going_away_aborts_the_worker_request(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        # Closing the stream.
        stream = router.stream(request("gone-1", "long answer", 2000, interval_ms=50))
        async for _ in stream:
            break
        assert await running(stream.worker) == 1
        await stream.aclose()
        await wait_until(lambda: _is_zero(stream.worker), timeout=10, message="worker request aborted after aclose")
        # Cancelling the task that iterates it.
        got = Collected()
        task = asyncio.create_task(consume(router, request("gone-2", "long answer", 2000, interval_ms=50), got))
        await wait_until(lambda: got.received > 0, timeout=30, message="stream under way")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: _is_zero(got.stream.worker), timeout=10, message="worker request aborted after cancel")
        assert all(w.in_flight == 0 for w in router.snapshot())


async def _is_zero(address: str) -> bool:
    return await running(address) == 0


async def test_abusive_key_is_limited_while_a_polite_key_is_served(two_workers):
    a, b = two_workers
    admission = AdmissionConfig(keys={"abusive": KeyLimits(requests_per_min=3)})
    async with routed(a.address, b.address, admission=admission) as router:
        outcomes = []
        for i in range(8):
            try:
                await consume(router, request(f"abuse-{i}", "spam", 3), Collected(), key="abusive")
                outcomes.append("ok")
            except RateLimitedError as exc:
                assert exc.reason == "requests_per_min" and exc.retry_after > 0
                outcomes.append("limited")
        assert outcomes == ["ok"] * 3 + ["limited"] * 5
        polite = await asyncio.gather(*(consume(router, request(f"polite-{i}", "hello", 3), Collected(), key="polite")
                                        for i in range(8)))
        assert all(len(c.finals) == 1 for c in polite)
        assert counter(router, "rejections", reason="requests_per_min") == 5


async def test_class_queue_full_rejects_and_slots_are_given_back(two_workers):
    a, b = two_workers
    admission = AdmissionConfig(short_max_in_flight=1, short_queue_size=1, queue_timeout_s=30)
    async with routed(a.address, b.address, admission=admission) as router:
        first, second = Collected(), Collected()
        t1 = asyncio.create_task(consume(router, request("q1", "slow one", 1000, interval_ms=50), first))
        await wait_until(lambda: first.received > 0, timeout=30, message="first request running")
        t2 = asyncio.create_task(consume(router, request("q2", "waits", 5), second))
        await wait_until(lambda: router.metrics.get_sample_value(
            "vllm_fleet_router_queue_depth", {"workload_class": "short"}) == 1, timeout=10, message="second queued")
        with pytest.raises(RateLimitedError) as info:
            await consume(router, request("q3", "refused", 5), Collected())
        assert info.value.reason == "queue_full"
        await asyncio.wait_for(asyncio.gather(t1, t2), timeout=60)
        await consume(router, request("q4", "slot free again", 5), Collected())


async def test_models_are_selected_by_name_and_unknown_models_are_refused(mock_worker_factory):
    alpha, beta = await asyncio.gather(mock_worker_factory.start(served_model_name="alpha", mock_tokens_per_s=200),
                                       mock_worker_factory.start(served_model_name="beta", mock_tokens_per_s=200))
    try:
        async with routed(alpha.address, beta.address) as router:
            assert router.models() == ["alpha", "beta"]
            for _ in range(3):
                got = await consume(router, request("beta", "which model", 3), Collected(), model="beta")
                assert got.stream.worker == beta.address
            with pytest.raises(UnknownModelError, match="alpha, beta"):
                router.stream(request("x", "y", 3), model="gamma")
            with pytest.raises(InvalidRequestError, match="name a model"):
                router.stream(request("x", "y", 3))
    finally:
        alpha.stop(timeout=10)
        beta.stop(timeout=10)


async def test_bad_requests_are_not_retried(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        stream = router.stream(request("bad", "too long an answer", 10_000_000))
        with pytest.raises(InvalidRequestError):
            async for _ in stream:
                pass
        assert stream.attempts == 1
        assert counter(router, "retries", reason="InvalidRequestError") == 0


async def test_deadline_stops_the_stream_and_the_worker_request(two_workers):
    a, b = two_workers
    async with routed(a.address, b.address) as router:
        loop = asyncio.get_running_loop()
        stream = router.stream(request("late", "never finishes in time", 3000, interval_ms=50),
                               deadline=loop.time() + 1.0)
        with pytest.raises(DeadlineExceededError):
            async for _ in stream:
                pass
        assert stream.attempts == 1
        await wait_until(lambda: _is_zero(stream.worker), timeout=10, message="worker request gone after deadline")


async def test_no_serving_worker_is_a_no_worker_error():
    registry = StaticRegistry.from_spec("127.0.0.1:9")  # nothing listens on the discard port
    router = Router(registry, RouterConfig(**FAST), metrics_registry=CollectorRegistry())
    await router.start()
    try:
        with pytest.raises(NoWorkerError, match="127.0.0.1:9"):
            await router.wait_ready(timeout=0.5)
        stream = router.stream(request("none", "nobody home", 3))
        with pytest.raises(NoWorkerError) as info:
            await stream.__anext__()
        assert info.value.retry_after > 0
    finally:
        await router.close()


async def test_token_budget_is_settled_with_what_a_request_really_used(two_workers):
    a, b = two_workers
    admission = AdmissionConfig(keys={"k": KeyLimits(tokens_per_min=1000)})
    async with routed(a.address, b.address, admission=admission) as router:
        big = request("big-1", "short prompt", 900, interval_ms=50)
        stream = router.stream(big, key="k")
        async for _ in stream:
            break  # the client goes away after the first chunk: most of the 900 were never used
        await stream.aclose()
        # Without settlement the key would still hold ~905 reserved tokens and be refused.
        second = router.stream(request("big-2", "short prompt", 900, interval_ms=50), key="k")
        await second.admit()
        with pytest.raises(RateLimitedError) as info:  # while the second holds its reservation
            await router.stream(request("big-3", "short prompt", 900), key="k").admit()
        assert info.value.reason == "tokens_per_min"
        await second.aclose()


async def test_draining_worker_finishes_its_streams_and_gets_no_new_ones(mock_worker_factory):
    a, b = await asyncio.gather(mock_worker_factory.start(mock_tokens_per_s=100, drain_grace_s=60),
                                mock_worker_factory.start(mock_tokens_per_s=100))
    try:
        async with routed(a.address, b.address, policy="round_robin") as router:
            long = Collected()
            req = request("drain", "a long answer", 300, interval_ms=50)
            task = asyncio.create_task(consume(router, req, long))
            await wait_until(lambda: long.received > 0, timeout=30, message="stream under way")
            draining = a if long.stream.worker == a.address else b
            other = b if draining is a else a
            draining.signal(signal.SIGTERM)
            await wait_until(lambda: router.snapshot().get(draining.address).state != "serving", timeout=10,
                             message="draining worker out of rotation")
            for i in range(4):
                got = await consume(router, request(f"new-{i}", "during the drain", 3), Collected())
                assert got.stream.worker == other.address
            await asyncio.wait_for(task, timeout=60)
            assert long.stream.attempts == 1 and long.stream.worker == draining.address
            assert_same_output(long, await reference(other.address, req))
    finally:
        a.stop(timeout=10)
        b.stop(timeout=10)


async def test_a_recovering_worker_takes_many_streams_at_once_after_its_first_probe_answers(mock_worker_factory):
    # A worker back from a crash is half-open: one probe at a time. The probe proves it at its
    # first output, so the streams that arrive together (say, migrating off a dead worker) wait
    # for that and then all run, instead of failing with "no worker" or trickling one by one
    # behind a probe that streams for minutes. Seen on a real node: 15 of 16 streams failed.
    worker = await mock_worker_factory.start(mock_tokens_per_s=20, mock_ttft_ms=50)
    try:
        async with routed(worker.address, breaker_failures=1, breaker_successes=2, breaker_open_s=0.2,
                          ejection_max_ratio=1.0) as router:  # 1.0: a model's only worker may be taken out
            router._pool.report(worker.address, False)  # a failed request, as the router records one
            await wait_until(lambda: router.snapshot().get(worker.address).breaker == "half_open", timeout=10,
                             message="the breaker half-open")
            outs = [Collected() for _ in range(6)]
            tasks = [asyncio.create_task(consume(router, request(f"back-{i}", "after a crash", 30), out))
                     for i, out in enumerate(outs)]
            await wait_until(lambda: router.snapshot().get(worker.address).breaker == "closed" or any(
                t.done() for t in tasks), timeout=30, message="the breaker closed")
            assert not any(t.done() for t in tasks), "the breaker closed only after a whole stream ended"
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert [type(r).__name__ for r in results] == ["Collected"] * 6, results
            assert all(len(out.tokens[(0, 0)]) == 30 for out in outs)
    finally:
        worker.stop(timeout=10)
