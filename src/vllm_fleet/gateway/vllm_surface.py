"""The routes of `vllm serve` this gateway does not serve, each with the reason (#27).

A client pointed at the gateway instead of `vllm serve` gets, for these, a 501 with the OpenAI
error body naming the route and why, never a bare 404. tests/gateway/test_vllm_routes.py
compares `vllm serve`'s route table (read from the installed vLLM at run time) with the
gateway's: every route there is served here or listed below.

NOT_STORED are the Responses routes that take a response id: the fleet keeps no responses, so
they answer OpenAI's 404 for an unknown id, with the reason. docs/gateway.md shows every route.
"""

from __future__ import annotations

import re

from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.call import Call, Route

_ONE_ENGINE = ("acts on one engine; a fleet changes workers through the node supervisor "
               "(drain, restart), not through the gateway")
_RL = "an RL trainer's weight-sync hook into one engine (dev mode); a fleet takes new weights by restarting workers"

# (method, vLLM's path template) → why the fleet does not route it.
NOT_ROUTED: dict[tuple[str, str], str] = {
    ("GET", "/docs"): "the gateway describes its API at /openapi.json and serves no docs page",
    ("GET", "/docs/oauth2-redirect"): "the gateway serves no docs page (see /openapi.json)",
    ("GET", "/redoc"): "the gateway serves no docs page (see /openapi.json)",
    ("GET", "/kv_event_sources"): "workers relay their engines' KV-cache events over gRPC (KvEvents); "
                                   "the engines' ZMQ sockets stay inside the workers",
    ("GET", "/tokenizer_info"): "off by default in `vllm serve` too (--enable-tokenizer-info-endpoint); "
                                "not built for the fleet",
    ("POST", "/invocations"): "SageMaker's container entry point; call the gateway's /v1 routes directly",
    ("POST", "/start_profile"): "starts one engine's torch profiler (dev only); profile a worker on its machine",
    ("POST", "/stop_profile"): "stops one engine's torch profiler (dev only); profile a worker on its machine",
    ("POST", "/reset_prefix_cache"): "a fleet-wide reset needs a worker call not built yet; cache-aware routing "
                                     "also indexes those caches",
    ("POST", "/reset_mm_cache"): "a multimodal cache; the fleet serves text models",
    ("POST", "/reset_encoder_cache"): "a multimodal encoder cache; the fleet serves text models",
    ("POST", "/collective_rpc"): "runs any method on one engine's processes: no gateway of a shared fleet "
                                 "may expose that",
    ("GET", "/server_info"): "one engine's config dump (dev mode); each worker's settings are in "
                             "/dashboard/state.json",
    ("POST", "/sleep"): "a sleeping worker would still be routed to; " + _ONE_ENGINE,
    ("POST", "/wake_up"): _ONE_ENGINE,
    ("GET", "/is_sleeping"): "workers never sleep in a fleet (see POST /sleep)",
    ("POST", "/release_kv_cache_memory"): _ONE_ENGINE,
    ("POST", "/pause"): "pauses one engine's scheduling (RL); " + _ONE_ENGINE,
    ("POST", "/resume"): "resumes one engine's scheduling (RL); " + _ONE_ENGINE,
    ("GET", "/is_paused"): "workers are never paused in a fleet (see POST /pause)",
    ("POST", "/abort_requests"): "aborts by the engine's request ids; a client aborts a fleet request by "
                                 "closing its connection",
    ("POST", "/init_weight_transfer_engine"): _RL,
    ("POST", "/shutdown_weight_transfer_engine"): _RL,
    ("POST", "/start_weight_update"): _RL,
    ("POST", "/start_draft_weight_update"): _RL,
    ("POST", "/update_weights"): _RL,
    ("POST", "/finish_weight_update"): _RL,
    ("POST", "/update_weight_version"): _RL,
    ("GET", "/weight_info"): _RL,
    ("POST", "/weight_checker"): _RL,
    ("GET", "/get_world_size"): "one engine's parallel world size; a fleet has one per worker "
                                "(/dashboard/state.json)",
    ("POST", "/v1/chat/completions/batch"): "vLLM's many-conversations-in-one-call chat; send the "
                                            "conversations as requests, or use /v1/batches",
    ("POST", "/generative_scoring"): "not routed yet: its token-probability scoring needs a worker call",
    ("POST", "/v1/systemone"): "vLLM's structured-decision endpoint; not routed yet",
    ("POST", "/scale_elastic_ep"): "resizes one engine's expert-parallel group; a fleet scales by workers",
    ("POST", "/is_scaling_elastic_ep"): "one engine's expert-parallel scaling (see POST /scale_elastic_ep)",
    ("POST", "/v1/chat/completions/derender"): "token ids back to a chat answer; not routed yet "
                                               "(POST /detokenize gives the text)",
    ("POST", "/v1/completions/derender"): "token ids back to a completion; not routed yet "
                                          "(POST /detokenize gives the text)",
    ("POST", "/inference/v1/generate"): "vLLM's token-in/token-out API for a front end that renders "
                                        "itself; the fleet's is the workers' gRPC Generate",
    ("POST", "/inference/v1/abort_requests"): "belongs to /inference/v1/generate (not routed)",
    ("POST", "/cohere/v2/chat"): "Cohere's chat shape (needs the cohere SDK in `vllm serve`); not routed: "
                                 "use /v1/chat/completions",
    ("POST", "/cohere/v2/chat/render"): "Cohere's chat shape; not routed (use /v1/chat/completions/render)",
    ("GET", "/v1/realtime"): "a WebSocket audio stream; the fleet serves text models",
    ("POST", "/v1/audio/transcriptions"): "speech-to-text models; the fleet serves text models",
    ("POST", "/v1/audio/translations"): "speech-to-text models; the fleet serves text models",
    ("POST", "/fault_tolerance/apply"): "one engine's data-parallel fault tolerance; the fleet's is "
                                        "failover and migration between workers",
    ("GET", "/fault_tolerance/status"): "one engine's data-parallel fault tolerance (see "
                                        "/fault_tolerance/apply)",
}

# Responses by id: the fleet keeps no responses (gateways share no store; docs/gateway.md,
# "Responses API"), so an id never names one. OpenAI's answer for an unknown id is 404.
NOT_STORED: dict[tuple[str, str], str] = {route: "the fleet stores no responses (Responses is stateless here: "
                                          "gateways share no store); send the whole conversation as input"
                                          for route in (("GET", "/v1/responses/{response_id}"),
                                                        ("POST", "/v1/responses/{response_id}/cancel"))}
NOT_ROUTED.update({
    ("POST", "/v1/responses/render"): "not built: render the equivalent chat with /v1/chat/completions/render",
    ("POST", "/v1/messages/render"): "not built: render the equivalent chat with /v1/chat/completions/render",
    ("POST", "/v2/embed"): "Cohere's embed shape; use /v1/embeddings (vLLM's shape)",
})


def refusal(method: str, path: str) -> Route | None:
    """A route answering 501 for a `vllm serve` route the gateway does not serve; None for others."""
    for (refused_method, template), reason in NOT_ROUTED.items():
        if refused_method == method and _matches(template, path):
            return Route("key", _refuse(method, template, reason))
    for (stored_method, template), reason in NOT_STORED.items():
        if stored_method == method and _matches(template, path):
            return Route("key", _not_found(path, reason))
    return None


def _matches(template: str, path: str) -> bool:
    if "{" not in template:
        return template == path
    pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
    return re.fullmatch(pattern, path) is not None


def _refuse(method: str, template: str, reason: str):
    async def handle(call: Call) -> Response:
        raise ApiError(501, f"{method} {template} is a `vllm serve` endpoint that vllm-fleet does not route: "
                            f"{reason}", type="not_implemented", code="not_routed")
    return handle


def _not_found(path: str, reason: str):
    async def handle(call: Call) -> Response:
        response_id = path.split("/")[3]
        raise ApiError(404, f"response {response_id!r} not found: {reason}", code="response_not_found")
    return handle
