"""`vllm serve`'s token and introspection routes, through the fleet (#27).

    POST /tokenize                     {"prompt"} or {"messages", "tools", "add_generation_prompt", ...}
    POST /detokenize                   {"tokens"}
    POST /v1/chat/completions/render   a chat body → the token ids and sampling vLLM would run
    POST /v1/completions/render        a completion body → one such answer per prompt
    GET  /version                      {"version": the workers' vLLM version}
    GET  /load                         {"server_load": requests this gateway's router has open}

The answers are vLLM's own, computed on a worker serving the body's model by vLLM's serving
classes (worker/openai/introspect.py), never by the router's tokenizer mirror; a worker that
is down hands the call to the next (router/unary.py). The body goes through as it came, in
vLLM's shape, so a field vLLM does not read is refused there by name.
"""

from __future__ import annotations

import logging

from vllm_fleet import __version__
from vllm_fleet.gateway.api_error import ApiError, bad_request
from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.call import Call, Route
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import json_object
from vllm_fleet.router import Router

logger = logging.getLogger(__name__)


class IntrospectionRoutes:
    """Handlers of the routes above; `routes()` is their part of the gateway's route table."""

    def __init__(self, router: Router, config: GatewayConfig) -> None:
        self.router = router
        self.config = config

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("POST", "/tokenize"): Route("key", self._endpoint("tokenize")),
            ("POST", "/detokenize"): Route("key", self._endpoint("detokenize")),
            ("POST", "/v1/chat/completions/render"): Route("key", self._endpoint("render_chat")),
            ("POST", "/v1/completions/render"): Route("key", self._endpoint("render_completion")),
            ("GET", "/version"): Route("key", self.version),
            ("GET", "/load"): Route("key", self.load),
        }

    def _endpoint(self, endpoint: str):
        async def handle(call: Call) -> Response:
            body = json_object((await call.http.read_body(self.config.max_body_bytes)) or b"{}")
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                raise bad_request("model: must be a string", param="model")
            call.record.model = model
            answer = await self.router.introspect(endpoint, body, model=model)
            logger.info("%s answered for model %s", endpoint, model or "(only model)",
                        extra={"request_id": call.record.request_id})
            return Response.json(answer)
        return handle

    async def version(self, call: Call) -> Response:
        """vLLM's `{"version"}`: the serving workers' vLLM version (several, comma-separated, during
        a rolling upgrade), and this fleet's own version beside it."""
        versions = sorted({info.engine_version for model in self.router.models()
                           if (info := self.router.model_info(model)) is not None and info.engine_version})
        if not versions:
            raise ApiError(503, "no serving worker has reported its vLLM version yet", type="service_unavailable",
                           code="no_worker")
        return Response.json({"version": ", ".join(versions), "vllm_fleet_version": __version__})

    async def load(self, call: Call) -> Response:
        """vLLM's `{"server_load"}` (requests in progress), for the fleet: the requests this
        gateway's router has open on its workers."""
        return Response.json({"server_load": sum(w.in_flight for w in self.router.snapshot())})

