"""LoRA adapter admin endpoints in vLLM's shape, and adapters' model cards (#16).

    POST /v1/load_lora_adapter    {"lora_name", "lora_path", "base_model_name"?}   (admin key)
    POST /v1/unload_lora_adapter  {"lora_name"}                                     (admin key)

As `vllm serve` answers them: 200 with a plain-text "Success: ..." line; 400 for a missing
field, a bad folder or a rank above the workers' --max-lora-rank (the error names the field);
404 for an unload of an adapter the fleet does not know. A load registers the adapter with
the router's catalog and loads it on one worker at once, so a bad folder fails here and not
at the first request; requests naming it as their model then run on a worker holding it
(loaded on demand elsewhere, see router/adapters.py). `base_model_name` is needed only when
the fleet serves several models. An unload waits for the requests running on the adapter.
"""

from __future__ import annotations

import logging

from vllm_fleet.gateway.api_error import bad_request
from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.call import Call
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import json_object
from vllm_fleet.router import Router

logger = logging.getLogger(__name__)

TEXT_TYPE = b"text/plain; charset=utf-8"
# vLLM's request fields (lora_int_id, load_inplace: accepted, unused: the fleet goes by names).
_LOAD_FIELDS = {"lora_name": str, "lora_path": str, "base_model_name": str, "load_inplace": bool}
_UNLOAD_FIELDS = {"lora_name": str, "lora_int_id": int}


class AdapterAdmin:
    """The two admin routes' handlers."""

    def __init__(self, router: Router, config: GatewayConfig) -> None:
        self.router = router
        self.config = config

    async def load(self, call: Call) -> Response:
        body = _parse(await call.http.read_body(self.config.max_body_bytes), _LOAD_FIELDS)
        name, path = body.get("lora_name") or "", body.get("lora_path") or ""
        if not name or not path:
            raise bad_request("Both 'lora_name' and 'lora_path' must be provided.",
                              param="lora_name" if not name else "lora_path")
        base = body.get("base_model_name") or self._only_model()
        address = await self.router.adapters.register(name, path, base)
        logger.info("adapter %s (%s) registered for %s, loaded on %s", name, path, base, address)
        return _text(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, call: Call) -> Response:
        body = _parse(await call.http.read_body(self.config.max_body_bytes), _UNLOAD_FIELDS)
        name = body.get("lora_name") or ""
        if not name:
            raise bad_request("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
        workers = await self.router.adapters.unregister(name)
        logger.info("adapter %s unloaded from %d worker(s)", name, len(workers))
        return _text(f"Success: LoRA adapter '{name}' removed successfully.")

    def _only_model(self) -> str:
        models = self.router.snapshot().known_models()
        if len(models) != 1:
            raise bad_request(f"name the adapter's base model in base_model_name: this fleet serves "
                              f"{', '.join(models) or 'no model yet'}", param="base_model_name")
        return models[0]


def adapter_cards(router: Router) -> list[dict]:
    """Model cards of the fleet's adapters, as vLLM shows them: `parent` is the base model."""
    return [adapter_card(entry.name, entry.path, entry.base) for entry in router.adapters.catalog().values()]


def adapter_card(name: str, path: str, base: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "vllm-fleet", "root": path or name,
            "parent": base}


def _parse(body: bytes, fields: dict[str, type]) -> dict:
    """The JSON object of an admin body, each field of its type; 400 naming the field otherwise."""
    data = json_object(body or b"{}")
    for name, value in data.items():
        kind = fields.get(name)
        if kind is None:
            raise bad_request(f"unknown field '{name}'", param=name, code="unknown_field")
        if value is not None and not isinstance(value, kind):
            raise bad_request(f"{name}: must be a {kind.__name__}", param=name, code="invalid_value")
    return data


def _text(message: str) -> Response:
    return Response(200, message.encode(), TEXT_TYPE)

