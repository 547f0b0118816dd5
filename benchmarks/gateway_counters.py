"""The batch controller's counters of a gateway over one benchmark phase, from its /metrics
(shared_pool_jobs.py reports them per Batch API phase)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The gateway's router counters reported per Batch API phase (summed over workers).
COUNTERS = {"cuts": "vllm_fleet_router_batch_cap_cuts_total", "withdrawals": "vllm_fleet_router_batch_withdrawals_total",
            "pauses": "vllm_fleet_router_batch_pauses_total"}


async def controller_counters(http: httpx.AsyncClient) -> dict[str, float]:
    """The COUNTERS summed over workers, and the cuts by "signal/source" too (cuts:itl/router ...)."""
    text = (await http.get("/metrics")).raise_for_status().text
    totals = dict.fromkeys(COUNTERS, 0.0)
    keys = {metric: key for key, metric in COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = keys.get(sample.name)
            if key is None:
                continue
            totals[key] += sample.value
            if key == "cuts":
                by = f"cuts:{sample.labels['signal']}/{sample.labels['source']}"
                totals[by] = totals.get(by, 0.0) + sample.value
    return totals


async def counted(http: httpx.AsyncClient, result) -> dict:
    """`result` (a coroutine's dict) with the gateway's controller counters over its run."""
    before = await controller_counters(http)
    done = await result
    after = await controller_counters(http)
    return {**done, **{f"gateway_{key}": after[key] - before.get(key, 0.0) for key in after}}
