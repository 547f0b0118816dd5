"""The gateway as an ASGI application: routes, authentication, metrics and access logs.

    GET  /health                 the process is alive (no auth)
    GET  /ready                  200 when enough workers serve, else 503 (no auth)
    GET  /openapi.json           the API description (no auth; it holds no secrets)
    GET  /v1/models[/{model}]    models of the fleet (key)
    POST /v1/chat/completions    (key)
    POST /v1/completions         (key)
    POST /v1/responses           OpenAI's Responses API, stateless (key; gateway/responses.py)
    POST /v1/messages            Anthropic's Messages API (key, also as x-api-key; gateway/anthropic/)
    POST /v1/messages/count_tokens
    GET  /metrics                Prometheus (admin key when keys are configured)
    GET  /dashboard              status page: static HTML/JS (no auth; it holds no data)
    GET  /dashboard/state.json   the page's data (admin key when keys are configured)
    POST /v1/load_lora_adapter   LoRA adapters, in vLLM's shape (admin key; gateway/adapters.py)
    POST /v1/unload_lora_adapter
    POST /v1/embeddings, /pooling, /score, /rerank, /classify (and vLLM's aliases)
                                 pooling models, in vLLM's shapes (key; gateway/pooling.py)
    /v1/files, /v1/files/{id}[/content], /v1/batches, /v1/batches/{id}[/cancel]
                                 OpenAI's Batch API, run as the batch class (key; gateway/batch/)
    POST /tokenize, /detokenize, /v1/chat/completions/render, /v1/completions/render; GET /version, /load
                                 vLLM's token and introspection routes, answered by a worker (gateway/introspect.py)
    GET|POST /ping               SageMaker's health check, as /health
    other `vllm serve` routes    501 naming the route and why the fleet does not route it (gateway/vllm_surface.py)

The path of one request: request id → route (404/405) → authenticate the route's need
(401/403) → `handler(Call)` → Response or StreamResponse. Any exception a handler raises
becomes its OpenAI error body in one place (`api_error.from_exception`); every handler has
the same signature (see call.py).

Without a keys file the gateway only listens on loopback (see GatewayConfig), and every route
is open to local callers.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry

from vllm_fleet.gateway import anthropic
from vllm_fleet.gateway import vllm_surface
from vllm_fleet.gateway.access_log import RequestRecord, request_id_from
from vllm_fleet.gateway.adapters import AdapterAdmin, adapter_card, adapter_cards
from vllm_fleet.gateway.api_error import ApiError, from_exception, unauthorized
from vllm_fleet.gateway.asgi import ClientGone, HttpRequest, Response, until_disconnect
from vllm_fleet.gateway.batch import BatchApi
from vllm_fleet.gateway.call import AuthNeed, Call, Route, worker_request_id
from vllm_fleet.gateway.completions import CompletionHandler
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.dashboard import Dashboard
from vllm_fleet.gateway.front_door import FrontDoor
from vllm_fleet.gateway.introspect import IntrospectionRoutes
from vllm_fleet.gateway.keys import KeyRecord, KeyStore
from vllm_fleet.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from vllm_fleet.gateway.openapi import openapi_document
from vllm_fleet.gateway.pooling import POOLING_PATHS, PoolingHandler
from vllm_fleet.gateway.responses import ResponsesHandler
from vllm_fleet.gateway.siblings import Siblings
from vllm_fleet.logs import request_id_var
from vllm_fleet.registry import Registry
from vllm_fleet.router import Router

logger = logging.getLogger(__name__)

# Status the client disconnect gets in logs and metrics (nginx's convention).
CLIENT_CLOSED = 499
MODEL_PREFIX = "/v1/models/"


class GatewayApp:
    def __init__(self, router: Router, config: GatewayConfig, *, metrics_registry: CollectorRegistry,
                 keys: KeyStore | None = None, registry: Registry | None = None,
                 siblings: Siblings | None = None) -> None:
        self.router = router
        self.config = config
        self.keys = keys
        # siblings: the other processes of `--processes N`; /metrics and the dashboard answer for all.
        self.metrics = GatewayMetrics(router, metrics_registry, siblings)
        door = FrontDoor(router, config, self.metrics)  # the skeleton the generating routes share
        self.completions = CompletionHandler(door)
        self.anthropic = anthropic.AnthropicHandler(door)
        self.dashboard = Dashboard(router, registry, self.metrics.totals, siblings)
        self.adapter_admin = AdapterAdmin(router, config)
        self.responses = ResponsesHandler(door)
        self.batches = BatchApi(self.completions, config, metrics_registry)
        self.pooling = PoolingHandler(router, config)
        self.introspection = IntrospectionRoutes(router, config)
        self._openapi = Response.json(openapi_document(config))
        self._routes: dict[tuple[str, str], Route] = {
            ("GET", "/health"): Route("none", self._health),
            ("GET", "/ready"): Route("none", self._ready),
            ("GET", "/openapi.json"): Route("none", self._openapi_json),
            ("GET", "/v1/models"): Route("key", self._models),
            ("POST", "/v1/chat/completions"): Route("key", self.completions.chat),
            ("POST", "/v1/completions"): Route("key", self.completions.completion),
            ("POST", "/v1/responses"): Route("key", self.responses.create),
            ("POST", "/v1/messages"): Route("key", self.anthropic.create),
            ("POST", "/v1/messages/count_tokens"): Route("key", self.anthropic.count_tokens),
            ("GET", "/metrics"): Route("admin", self._metrics),
            ("GET", "/dashboard"): Route("none", self.dashboard.page),
            ("GET", "/dashboard/app.js"): Route("none", self.dashboard.script),
            ("GET", "/dashboard/state.json"): Route("admin", self.dashboard.state),
            ("POST", "/v1/load_lora_adapter"): Route("admin", self.adapter_admin.load),
            ("POST", "/v1/unload_lora_adapter"): Route("admin", self.adapter_admin.unload),
            **self.batches.routes(),
            **self.pooling.routes(),
            **self.introspection.routes(),
            ("GET", "/ping"): Route("none", self._health),   # SageMaker's health check, as vllm serve answers it
            ("POST", "/ping"): Route("none", self._health),
        }
        # GET /v1/models/{model}: the one route with a path parameter.
        self._model_route = Route("key", self._model)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        http = HttpRequest.from_scope(scope, receive)
        request_id, from_client = request_id_from(http.headers)
        token = request_id_var.set(request_id)
        record = RequestRecord(request_id, http.method, http.path, http.client)
        extra = [(b"x-request-id", request_id.encode())]
        self.metrics.in_progress.inc()
        try:
            serve = self._serve(http, record, send, extra, worker_request_id(request_id, from_client))
            # Only POST handlers read a body; the disconnect watcher may read receive() after it.
            await until_disconnect(http, serve) if http.method == "POST" else await serve
        except ClientGone:
            record.status = record.status or CLIENT_CLOSED
            record.error = record.error or "client disconnected"
        finally:
            self.metrics.in_progress.dec()
            request_id_var.reset(token)
            self._account(record)

    async def _serve(self, http: HttpRequest, record: RequestRecord, send, extra, worker_rid: str) -> None:
        try:
            route = self._route(http)
            key_id = self._authenticate(http, route.need)
            record.key_id = key_id
            response = await route.handler(Call(http, record, key_id, worker_rid))
        except (ClientGone, GeneratorExit):
            raise
        except Exception as exc:
            error = from_exception(exc)
            if error.status >= 500:
                logger.error("request failed: %s", exc, exc_info=error.status == 500,
                             extra={"request_id": record.request_id})
            record.error = error.message
            # Anthropic's clients read Anthropic's error body on its routes.
            response = anthropic.anthropic_response(error) if http.path in anthropic.PATHS else Response.error(error)
        record.status = response.status
        await response.send(send, extra)

    def _route(self, http: HttpRequest) -> Route:
        """The route for the request; 404, or 405 with Allow, when there is none."""
        route = self._routes.get((http.method, http.path))
        if route is not None:
            return route
        if http.method == "GET" and http.path.startswith(MODEL_PREFIX):
            return self._model_route
        if (batch_route := self.batches.route(http.method, http.path)) is not None:
            return batch_route
        if (refused := vllm_surface.refusal(http.method, http.path)) is not None:
            return refused  # a `vllm serve` route the fleet does not serve: 501 with the reason
        allowed = sorted(method for method, path in self._routes if path == http.path)
        if allowed:
            error = ApiError(405, f"{http.method} is not allowed on {http.path}", code="method_not_allowed")
            error.extra_headers = [(b"allow", ", ".join(allowed).encode())]
            raise error
        raise ApiError(404, f"no route {http.method} {http.path}; see /openapi.json", code="not_found")

    def _authenticate(self, http: HttpRequest, need: AuthNeed) -> str | None:
        """The key id, or None when keys are off or the route is open; 401/403 otherwise."""
        if self.keys is None or need == "none":
            return None
        header = http.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if not header and http.headers.get("x-api-key"):  # how Anthropic's clients send the key
            scheme, presented = "bearer", http.headers["x-api-key"]
        if scheme.lower() != "bearer" or not presented.strip():
            self.metrics.reject("missing_key")
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')")
        record: KeyRecord | None = self.keys.authenticate(presented.strip())
        if record is None:
            self.metrics.reject("invalid_key")
            raise unauthorized("invalid API key")
        if need == "admin" and not record.admin:
            self.metrics.reject("not_admin")
            raise ApiError(403, f"key {record.id!r} may not read this; it needs \"admin\": true in the keys file",
                           type="permission_error", code="admin_required")
        return record.id

    def _account(self, record: RequestRecord) -> None:
        status = record.status or 500
        endpoint = record.path if record.path in _ENDPOINTS else "other"
        self.metrics.child(self.metrics.requests, endpoint, str(status)).inc()
        totals = self.metrics.totals
        if endpoint in _GENERATE:
            totals["requests"] += 1
            totals["errors"] += status >= 400
            totals["completion_tokens"] += record.completion_tokens
        if status in (400, 404, 413, 429, 503) and endpoint in _GENERATE:
            self.metrics.reject(_REASON.get(status, str(status)))
        if record.model and endpoint in _GENERATE and status == 200:
            self.metrics.child(self.metrics.e2e, record.model, endpoint).observe(time.perf_counter() - record.started)
        if self.config.access_log:
            record.emit()

    # -- routes ---------------------------------------------------------------------------

    async def _health(self, call: Call) -> Response:
        return Response.json({"status": "ok"})

    async def _ready(self, call: Call) -> Response:
        serving = sum(1 for w in self.router.snapshot() if w.state == "serving")
        ready = serving >= self.config.ready_workers
        return Response.json({"ready": ready, "serving_workers": serving, "models": self.router.models()},
                             status=200 if ready else 503)

    async def _openapi_json(self, call: Call) -> Response:
        return self._openapi

    async def _models(self, call: Call) -> Response:
        cards = [self._model_card(m) for m in self.router.models()]
        return Response.json({"object": "list", "data": cards + adapter_cards(self.router)})

    async def _model(self, call: Call) -> Response:
        model = call.http.path[len(MODEL_PREFIX):]
        adapter = self.router.adapters.catalog().get(model)
        if adapter is not None and model not in self.router.models():
            return Response.json(adapter_card(adapter.name, adapter.path, adapter.base))
        if self.router.model_info(model) is None:
            raise ApiError(404, f"model {model!r} is not served here", param="model", code="model_not_found")
        return Response.json(self._model_card(model))

    def _model_card(self, model: str) -> dict:
        info = self.router.model_info(model)
        card = {"id": model, "object": "model", "created": 0, "owned_by": "vllm-fleet"}
        if info is not None:
            card["max_model_len"] = info.max_model_len
        return card

    async def _metrics(self, call: Call) -> Response:
        return Response(200, await self.metrics.render_gateway(), CONTENT_TYPE.encode())


_GENERATE = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
_ENDPOINTS = (*_GENERATE, *POOLING_PATHS,
              "/v1/files", "/v1/batches", "/v1/models", "/health", "/ready", "/metrics", "/openapi.json",
              "/dashboard", "/dashboard/state.json")
_REASON = {400: "invalid_request", 404: "unknown_model", 413: "body_too_large", 429: "rate_limited",
           503: "no_worker"}


async def _lifespan(receive, send) -> None:
    # The router is started and closed by whoever built it (server.py); nothing to do here.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
