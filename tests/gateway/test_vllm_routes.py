"""The gateway's routes against `vllm serve`'s, read from the installed vLLM at run time (#27).

Every route `vllm serve` registers (with every task, dev mode, profiler, LoRA updates and the
tokenizer-info route switched on) must be answered by the gateway: served, or refused with a
501 that names the route and says why (gateway/vllm_surface.py), never a bare 404/405. The
check is by HTTP against a gateway over mock workers, so it holds whichever way a route is
served, including routes other parts of #27 add later.
"""

from __future__ import annotations

import argparse
import os
import re
import typing
from pathlib import Path

import httpx
import pytest

from vllm_fleet.gateway import vllm_surface


class _PoolingModelStandIn:
    """Just enough of a ModelConfig for vLLM to register its pooling and scoring routes."""

    hf_config = argparse.Namespace(num_labels=1)

    def get_pooling_task(self, supported_tasks):
        return "embed"

    def __getattr__(self, name):
        return None


def _vllm_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route `vllm serve` can register; WebSocket routes as GET."""
    try:
        from fastapi import FastAPI
        from vllm.entrypoints.launchers.api_server.routers import register_api_routers
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.tasks import SupportedTask
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        pytest.skip(f"vLLM 0.32's route registration is not importable here ({exc})")
    switches = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args([
            "--enable-tokenizer-info-endpoint",
            "--profiler-config", '{"profiler": "torch", "torch_profiler_dir": "/tmp/vllm-fleet-unused"}'])
        args.enable_fault_tolerance = True
        app = FastAPI()
        app.state.args = args
        try:
            register_api_routers(args, app, typing.get_args(SupportedTask), _PoolingModelStandIn())
        except Exception:  # a stand-in too thin for this vLLM's pooling routes: compare the rest
            app = FastAPI()
            app.state.args = args
            register_api_routers(args, app, typing.get_args(SupportedTask), None)
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    routes = set()
    for route in app.routes:
        methods = getattr(route, "methods", None)
        if methods is None and type(route).__name__ == "APIWebSocketRoute":
            methods = {"GET"}
        for method in methods or ():
            if method != "HEAD":
                routes.add((method, route.path))
    return sorted(routes)


@pytest.fixture(scope="module")
def vllm_routes():
    routes = _vllm_routes()
    # The table must be vLLM's whole surface, not whatever a stripped-down registration gave.
    assert ("POST", "/tokenize") in routes and ("POST", "/sleep") in routes and len(routes) > 50
    return routes


async def test_every_vllm_route_is_served_or_refused_by_name(gateway, vllm_routes):
    unanswered, unexplained = [], []
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for method, template in vllm_routes:
            path = re.sub(r"\{[^}]+\}", "x", template)
            reply = await http.request(method, path, json={} if method == "POST" else None)
            error = reply.json().get("error") or {} if reply.headers.get("content-type", "").startswith(
                "application/json") else {}
            # The gateway's own "no such route" answers; a served route's 404 (an unknown response id,
            # an unknown model) is an answer.
            if (reply.status_code == 404 and str(error.get("message", "")).startswith("no route ")) or \
                    (reply.status_code == 405 and error.get("code") == "method_not_allowed"):
                unanswered.append(f"{method} {template}")
            elif reply.status_code == 501:
                message = error.get("message", "")
                if not (message.startswith(f"{method} {template} is a `vllm serve` endpoint") or
                        error.get("code") == "introspect_unsupported"):
                    unexplained.append(f"{method} {template}: {message}")
    assert not unanswered, f"`vllm serve` routes the gateway answers with a bare 404/405: {unanswered}"
    assert not unexplained, unexplained


async def test_a_refused_route_names_itself_and_the_gateway_keeps_serving(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post("/v1/audio/transcriptions", json={})
        assert reply.status_code == 501
        error = reply.json()["error"]
        assert error["message"].startswith("POST /v1/audio/transcriptions is a `vllm serve` endpoint that "
                                           "vllm-fleet does not route: ")
        assert error["type"] == "not_implemented" and error["code"] == "not_routed"
        # A route with a path parameter is matched too: the fleet stores no responses, so OpenAI's 404, with why.
        templated = await http.get("/v1/responses/resp_123")
        assert templated.status_code == 404, templated.text
        assert templated.json()["error"]["message"].startswith("response 'resp_123' not found: the fleet stores no")
        assert (await http.get("/no/such/route")).status_code == 404  # not vLLM's: still a plain 404
        assert (await http.get("/health")).status_code == 200


async def test_tokenize_on_a_mock_worker_says_it_cannot(gateway):
    """The mock engine has no vLLM tokenizer: the gateway says so (501), it does not guess."""
    from gateway_support import MODEL_A

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post("/tokenize", json={"model": MODEL_A, "prompt": "hello"})
        assert reply.status_code == 501, reply.text
        assert "mock engine" in reply.json()["error"]["message"]
        two_models = await http.post("/tokenize", json={"prompt": "hello"})
        assert two_models.status_code == 400 and two_models.json()["error"]["param"] == "model"
        assert (await http.post("/detokenize", content=b"not json")).status_code == 400


def test_docs_list_every_vllm_route(vllm_routes):
    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    missing = [f"{method} {path}" for method, path in vllm_routes if f"`{method} {path}`" not in doc]
    assert not missing, f"docs/gateway.md's `vllm serve` route table lacks {missing}"


def test_refusals_say_why():
    for route, reason in (vllm_surface.NOT_ROUTED | vllm_surface.NOT_STORED).items():
        assert reason and "|" not in reason, route  # shown in a Markdown table
