"""Metric definitions on synthetic timelines whose answers are known by construction."""

from __future__ import annotations

import pytest

from vllm_fleet.bench.metrics import Slo, distribution, summarize
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.errors import ConfigError


def steady(request_id: str, *, start: float, ttft: float, gap: float, tokens: int, **kw) -> RequestRecord:
    """A request whose tokens arrive one per chunk, `gap` apart after the first."""
    times = [start + ttft + i * gap for i in range(tokens)]
    return RequestRecord(request_id, start=start, end=times[-1], chunk_times=times, chunk_tokens=[1] * tokens,
                         output_tokens=tokens, **kw)


def test_ttft_tpot_e2e_of_one_request():
    record = steady("a", start=1.0, ttft=0.1, gap=0.02, tokens=4)
    assert record.ttft == pytest.approx(0.1)
    assert record.e2e == pytest.approx(0.16)
    assert record.tpot == pytest.approx((0.16 - 0.1) / 3)
    assert record.inter_token_latencies() == pytest.approx([0.02, 0.02, 0.02])


def test_tpot_is_undefined_for_a_single_token():
    assert steady("a", start=0, ttft=0.1, gap=0.02, tokens=1).tpot is None


def test_itl_spreads_a_coalesced_chunk_over_its_tokens():
    record = RequestRecord("a", start=0.0, end=0.2, chunk_times=[0.1, 0.2], chunk_tokens=[1, 4], output_tokens=5)
    assert record.inter_token_latencies() == pytest.approx([0.025] * 4)
    assert record.tpot == pytest.approx(0.1 / 4)


def test_percentiles_and_mean_in_milliseconds():
    dist = distribution([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert dist["mean"] == pytest.approx(50.5)
    assert dist["p50"] == pytest.approx(50.5)
    assert dist["p90"] == pytest.approx(90.1)
    assert dist["p99"] == pytest.approx(99.01)
    assert dist["count"] == 100


def test_summary_leaves_out_warmup_and_failed_requests_from_latency():
    records = [steady(f"r{i}", start=i * 0.5, ttft=0.1, gap=0.01, tokens=11) for i in range(4)]
    records.append(steady("warm", start=0.0, ttft=5.0, gap=1.0, tokens=3, warmup=True))
    records.append(RequestRecord("bad", start=1.0, end=1.05, error="http_429"))
    records.append(RequestRecord("bad2", start=1.0, end=1.05, error="http_429"))
    records.append(RequestRecord("bad3", start=1.0, end=1.05, error="timeout"))
    summary = summarize(records)
    assert summary["requests"] == {"sent": 7, "completed": 4, "failed": 3, "short_answers": 0}
    assert summary["errors"] == {"http_429": 2, "timeout": 1}
    assert summary["ttft_ms"]["p99"] == pytest.approx(100.0)
    assert summary["tpot_ms"]["mean"] == pytest.approx(10.0)
    # window: first measured start (0.0) to last measured end (1.5 + 0.1 + 0.1)
    assert summary["duration_s"] == pytest.approx(1.7)
    assert summary["request_throughput"] == pytest.approx(4 / 1.7)
    assert summary["output_throughput"] == pytest.approx(44 / 1.7)


def test_goodput_counts_requests_meeting_every_bound():
    fast = [steady(f"f{i}", start=i, ttft=0.1, gap=0.01, tokens=10) for i in range(3)]
    slow_first = steady("s1", start=3, ttft=0.9, gap=0.01, tokens=10)
    slow_tokens = steady("s2", start=3, ttft=0.1, gap=0.2, tokens=10)
    failed = RequestRecord("e", start=3, end=3.1, error="timeout")
    slo = Slo.parse("ttft=500ms,tpot=50ms")
    summary = summarize([*fast, slow_first, slow_tokens, failed], slo)
    assert summary["goodput"]["fraction"] == pytest.approx(3 / 6)
    assert summary["goodput"]["requests_per_s"] == pytest.approx(3 / summary["duration_s"])
    assert summary["goodput"]["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}


def test_slo_units_and_errors():
    slo = Slo.parse("ttft=0.5s, e2e=800ms,tpot=20")
    assert (slo.ttft, slo.e2e, slo.tpot) == pytest.approx((0.5, 0.8, 0.02))
    with pytest.raises(ConfigError, match="ttft=500ms"):
        Slo.parse("latency=5ms")
    assert Slo.parse("") is None


def test_empty_run_has_no_figures_but_does_not_fail():
    summary = summarize([])
    assert summary["requests"]["sent"] == 0
    assert summary["ttft_ms"]["p50"] is None
    assert summary["request_throughput"] == 0.0
