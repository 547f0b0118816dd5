"""Prometheus metrics of one worker, served on a side port."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        p = "vllm_fleet_worker_"
        self.requests = Counter(p + "requests_total", "Generate requests by outcome", ["outcome"], registry=registry)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS,
                              registry=registry)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between chunks, per token",
                             buckets=_ITL_BUCKETS, registry=registry)
        self.e2e = Histogram(p + "request_seconds", "Generate request duration", buckets=_LATENCY_BUCKETS,
                             registry=registry)
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "Prompt tokens", registry=registry)
        self.output_tokens = Counter(p + "output_tokens_total", "Generated tokens", registry=registry)
        self.in_flight = Gauge(p + "in_flight", "Generate calls open", registry=registry)
        self.running = Gauge(p + "running", "Sequences running in the engine", registry=registry)
        self.waiting = Gauge(p + "waiting", "Sequences waiting in the engine", registry=registry)
        self.kv_usage = Gauge(p + "kv_cache_usage", "KV cache usage (0..1)", registry=registry)
        self.prefix_hit_rate = Gauge(p + "prefix_cache_hit_rate", "Prefix cache hit rate (0..1)", registry=registry)
        self.router_ids = Counter(
            p + "router_ids_total", "Prompts that came with a router's token ids, by what the worker did: used "
            "(ran them, not rendered), verified (rendered, the same), mismatched (rendered, different: its own ran), "
            "declined (rendered: not trusted, other files, or a request they may not stand for)",
            ["outcome"], registry=registry)
        self.serving = Gauge(p + "serving", "1 while health says SERVING", registry=registry)
