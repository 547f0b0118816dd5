"""The OpenAI-compatible HTTP gateway in front of the router.

    server = GatewayServer(GatewayConfig(port=8000), RouterConfig(), StaticRegistry.from_spec("h:p,h:p"))
    await server.start(); ...; await server.stop()

Modules: config (settings), app (routes, auth, access log), asgi (HTTP plumbing, SSE,
disconnects), completions (the two generation endpoints), schemas (request bodies, also the
OpenAPI schemas), translate (body → GenerateRequest, pre-routing checks), sse / aggregate /
formats (response shapes), api_error (OpenAI error bodies, status mapping), keys (hashed API
keys), metrics (Prometheus), dashboard (status page), openapi, server (uvicorn lifecycle).
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
