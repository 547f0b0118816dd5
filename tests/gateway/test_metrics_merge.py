"""`--processes N`: one scrape answers for N gateway processes. Counters and histograms add up,
gauges merge by what they count, and a process that cannot answer is left out, not half-read."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_fleet.gateway.dashboard import merge_states
from vllm_fleet.gateway.metrics_merge import merge_expositions
from vllm_fleet.gateway.siblings import Siblings, SiblingSlot
from vllm_fleet.router.quota.metrics import QuotaMetrics

from gateway_support import MODEL_A


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def one_process(requests: int, latencies: list[float], in_flight: int, breaker: float) -> bytes:
    registry = CollectorRegistry()
    Counter("vllm_fleet_gateway_requests", "requests", ["status"], registry=registry).labels("200").inc(requests)
    histogram = Histogram("vllm_fleet_gateway_request_duration_seconds", "e2e", buckets=(0.1, 1), registry=registry)
    for latency in latencies:
        histogram.observe(latency)
    Gauge("vllm_fleet_router_in_flight", "in flight", ["worker"], registry=registry).labels("w1").set(in_flight)
    Gauge("vllm_fleet_router_breaker_state", "breaker", ["worker"], registry=registry).labels("w1").set(breaker)
    return generate_latest(registry)


def test_counters_and_histograms_add_up_and_gauges_merge_by_what_they_count():
    merged = samples(merge_expositions([one_process(3, [0.05, 0.5], in_flight=2, breaker=0.0),
                                        one_process(4, [2.0], in_flight=5, breaker=2.0)]))
    assert merged[("vllm_fleet_gateway_requests_total", (("status", "200"),))] == 7
    assert merged[("vllm_fleet_gateway_request_duration_seconds_count", ())] == 3
    assert merged[("vllm_fleet_gateway_request_duration_seconds_sum", ())] == pytest.approx(2.55)
    assert merged[("vllm_fleet_gateway_request_duration_seconds_bucket", (("le", "0.1"),))] == 1
    assert merged[("vllm_fleet_gateway_request_duration_seconds_bucket", (("le", "1.0"),))] == 2
    assert merged[("vllm_fleet_gateway_request_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert merged[("vllm_fleet_router_in_flight", (("worker", "w1"),))] == 7  # each holds its own requests
    assert merged[("vllm_fleet_router_breaker_state", (("worker", "w1"),))] == 2  # the worst any process sees


def test_a_gauge_without_a_merge_rule_is_refused_not_guessed():
    registry = CollectorRegistry()
    Gauge("vllm_fleet_new_thing", "added later", registry=registry).set(1)
    with pytest.raises(KeyError, match="vllm_fleet_new_thing"):
        merge_expositions([generate_latest(registry)] * 2)


async def test_every_gauge_a_gateway_exports_has_a_merge_rule(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        answer = await http.post("/v1/completions", json={"model": MODEL_A, "prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        text = (await http.get("/metrics")).content
    quota = CollectorRegistry()
    QuotaMetrics(quota).fallback.set(1)  # the --fleet-quota gauges, which this gateway does not run
    own = samples(text)
    merged = samples(merge_expositions([text, text, generate_latest(quota)]))  # raises on a gauge without a rule
    key = ("vllm_fleet_gateway_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))
    assert merged[key] == 2 * own[key]


def test_the_dashboard_adds_up_request_totals_and_per_worker_counts():
    def state(requests: int, in_flight: int) -> dict:
        return {"time": 0, "models": ["m"], "requests": {"requests": requests, "errors": 1, "completion_tokens": 10},
                "workers": [{"address": "w1", "state": "serving", "in_flight": in_flight, "outstanding_tokens": 3}]}

    merged = merge_states(state(5, 1), [state(7, 2)], processes=3)
    assert merged["requests"] == {"requests": 12, "errors": 2, "completion_tokens": 20}
    assert merged["workers"][0]["in_flight"] == 3 and merged["workers"][0]["outstanding_tokens"] == 6
    assert merged["processes"] == {"serving": 3, "answered": 2}


def test_the_dashboard_adds_up_batch_waiting_for_slack_with_the_longest_waits_reason():
    def state(waiting: int, waited_s: float, reason: str) -> dict:
        return {"time": 0, "models": ["m"], "requests": {}, "workers": [],
                "batch_waiting": {"waiting": waiting, "since": 1.0, "waited_s": waited_s, "reason": reason}}

    merged = merge_states(state(2, 3.0, "w1 KV"), [state(1, 40.0, "w2 waiting"), state(0, 0.0, "")], processes=3)
    assert merged["batch_waiting"] == {"waiting": 3, "since": 1.0, "waited_s": 40.0, "reason": "w2 waiting"}


async def test_siblings_answer_each_other_and_one_that_is_gone_or_cut_short_is_left_out(tmp_path):
    first = Siblings(SiblingSlot(tmp_path, 0, 4), timeout_s=5)
    second = Siblings(SiblingSlot(tmp_path, 1, 4), timeout_s=5)

    async def own(text: bytes):
        return text

    await first.start({"metrics": lambda: own(b"first")})
    await second.start({"metrics": lambda: own(b"second")})

    # Process 3 dies while answering: it promises more bytes than it sends.
    async def cut_short(reader, writer):
        await reader.readline()
        writer.write(b"100\npartial")
        await writer.drain()
        writer.close()

    dying = await asyncio.start_unix_server(cut_short, path=str(tmp_path / "3.sock"))
    try:
        # Process 2 is not there at all (restarting).
        assert await first.ask("metrics") == [b"second"]
        assert await second.ask("metrics") == [b"first"]
        assert await first.ask("no such question") == []
    finally:
        dying.close()
        await first.close()
        await second.close()
    assert not (tmp_path / "0.sock").exists()


def test_the_dashboard_lists_every_processs_cache_index():
    # Each gateway process keeps its own index: an SRE reading resyncs or malformed events needs
    # every process's counters, not one process's.
    def state(resyncs: int) -> dict:
        return {"time": 0, "models": ["m"], "requests": {}, "workers": [],
                "cache_index": [{"resyncs_needed": resyncs, "entries": {"w1": 10 * resyncs}}]}

    merged = merge_states(state(1), [state(2), {"time": 0, "models": [], "requests": {}, "workers": []}], processes=3)
    assert [stats["resyncs_needed"] for stats in merged["cache_index"]] == [1, 2]
