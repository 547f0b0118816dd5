"""Summary statistics over request records, with the usual serving-benchmark definitions.

- TTFT: time from sending a request to its first output chunk.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request (requests with < 2 tokens have none).
- ITL: gaps between output tokens as they arrived, pooled over all requests
  (see `RequestRecord.inter_token_latencies` for chunks that carry several tokens).
- E2E: time from sending to the last byte of the answer.
Each is reported as mean / P50 / P90 / P99 in milliseconds, over successful, non-warm-up
requests. A request that asked for `ignore_eos` and got fewer tokens than its max_tokens is a
short answer (`RequestRecord.short_answer`): counted under `requests.short_answers`, neither
completed nor failed, and left out of every figure, since it did less work than was asked.
Throughput divides by the measured window: from the first measured request sent to the last
one finished. Goodput counts only requests that met every SLO bound
(as in DistServe), per second of the same window.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.errors import ConfigError

PERCENTILES = (50, 90, 99)
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_SLO_RE = re.compile(r"^\s*(ttft|tpot|e2e)\s*=\s*([0-9.]+)\s*(us|ms|s)?\s*$")


@dataclass(frozen=True)
class Slo:
    """Latency bounds in seconds; a request is 'good' when it meets every bound that is set."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, spec: str | None) -> Slo | None:
        """`ttft=500ms,tpot=50ms,e2e=0.8s` (unit ms when left out)."""
        if not spec:
            return None
        bounds: dict[str, float] = {}
        for part in spec.split(","):
            match = _SLO_RE.match(part)
            if not match:
                raise ConfigError(f"--slo: cannot read {part!r}; write e.g. ttft=500ms,tpot=50ms,e2e=800ms")
            name, value, unit = match.groups()
            bounds[name] = float(value) * _UNITS[unit or "ms"]
        return cls(**bounds)

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        checks = ((self.ttft, record.ttft), (self.tpot, record.tpot), (self.e2e, record.e2e))
        return all(bound is None or (value is not None and value <= bound) for bound, value in checks)

    def to_dict(self) -> dict[str, float]:
        return {k: v * 1e3 for k, v in (("ttft_ms", self.ttft), ("tpot_ms", self.tpot), ("e2e_ms", self.e2e))
                if v is not None}


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, in their unit, interpolated linearly between
    ranks (numpy's default, as in `distribution`); NaN when there are none."""
    data = np.asarray(list(values), dtype=float)
    return float(np.percentile(data, q)) if data.size else float("nan")


def distribution(values_s: Iterable[float]) -> dict[str, float | None]:
    """mean and percentiles of `values_s` (seconds), in milliseconds; None when there are none."""
    data = np.asarray(list(values_s), dtype=float)
    if data.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "count": 0}
    result: dict[str, float | None] = {"mean": float(data.mean() * 1e3)}
    for p in PERCENTILES:
        result[f"p{p}"] = float(np.percentile(data, p) * 1e3)
    result["count"] = int(data.size)
    return result


def error_kinds(records: Iterable[RequestRecord]) -> dict[str, int]:
    return dict(Counter(r.error for r in records if r.error is not None).most_common())


def measured_window(records: list[RequestRecord]) -> float:
    """Seconds from the first measured request sent to the last one finished."""
    if not records:
        return 0.0
    return max(r.end for r in records) - min(r.start for r in records)


def summarize(records: Iterable[RequestRecord], slo: Slo | None = None) -> dict:
    """The summary of one run (one rate or concurrency): counts, latencies, throughput, goodput."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    window = measured_window(measured)
    per_s = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
    output_tokens = sum(r.output_tokens for r in ok)
    short = sum(1 for r in measured if r.short_answer)
    summary = {
        "requests": {"sent": len(measured), "completed": len(ok), "failed": len(measured) - len(ok) - short,
                     "short_answers": short},
        "duration_s": window,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(output_tokens),
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "ttft_ms": distribution(r.ttft for r in ok if r.ttft is not None),
        "tpot_ms": distribution(r.tpot for r in ok if r.tpot is not None),
        "itl_ms": distribution(gap for r in ok for gap in r.inter_token_latencies()),
        "e2e_ms": distribution(r.e2e for r in ok),
        "errors": error_kinds(measured),
    }
    if slo is not None:
        good = sum(1 for r in measured if slo.met_by(r))
        summary["goodput"] = {
            "slo": slo.to_dict(),
            "requests_per_s": per_s(good),
            "fraction": good / len(measured) if measured else 0.0,
        }
    return summary
