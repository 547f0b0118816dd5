"""The OpenAI-compatible HTTP gateway in front of the router.

    server = GatewayServer(GatewayConfig(port=8000), RouterConfig(), StaticRegistry.from_spec("h:p,h:p"))
    await server.start(); ...; await server.stop()

The path of a generation request, and where each rule is checked:

    app          route (404/405), API key (401/403), then `handler(Call)` (call.py)
    completions  body size (413) → translate
    translate    HTTP shape via the schemas (400, param = the field), this gateway's limits
                 (--max-n, --max-prompts, --max-top-logprobs, --max-tokens-limit), a pre-routing
                 guard that refuses prompts certain (by a bytes/token lower bound) to overflow the
                 context, so they never reach a worker
    router       unknown model (UnknownModelError → 404), admission (429), no worker (503)
    worker       the engine's exact limits: tokenized prompt + max_tokens vs context, vocabulary
    api_error    every exception above → status + OpenAI error body, in one function

Modules: config (settings), app (routes, auth, access log), call (the handler signature),
asgi (HTTP plumbing, SSE, disconnects), completions (the two generation endpoints), schemas
(request bodies, also the OpenAPI schemas), translate (body → GenerateRequest, the gateway's
checks), sse / aggregate / formats (response shapes), api_error (OpenAI error bodies, status
mapping), keys (hashed API keys), metrics (Prometheus), dashboard (status page), openapi,
server (uvicorn lifecycle).
"""

from vllm_fleet.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "GatewayServer", "GatewayApp"]


def __getattr__(name: str):
    # The server pulls in uvicorn and the router; importing the config alone stays cheap.
    if name == "GatewayServer":
        from vllm_fleet.gateway.server import GatewayServer

        return GatewayServer
    if name == "GatewayApp":
        from vllm_fleet.gateway.app import GatewayApp

        return GatewayApp
    raise AttributeError(name)
