"""deploy/grafana-dashboard.json queries only metrics the gateway really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"


async def test_every_dashboard_metric_is_exported(gateway):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {re.sub(r"_bucket$", "", m) for e in exprs for m in re.findall(r"vllm_fleet_[a-z_]+", e)}
    assert len(names) >= 12
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        assert (await http.post("/v1/completions", json={"model": "mock-a", "prompt": "x", "max_tokens": 2})).status_code == 200
        exported = (await http.get("/metrics")).text
    missing = sorted(n for n in names if f"# TYPE {n.removesuffix('_total')} " not in exported
                     and f"# TYPE {n} " not in exported)
    assert not missing, f"dashboard queries metrics nobody exports: {missing}"
