"""The OpenAPI 3.1 document at /openapi.json, generated from the same pydantic models that
validate requests and from fields.py's table, so it cannot drift from what the gateway accepts."""

from __future__ import annotations

from vllm_fleet import __version__
from vllm_fleet.gateway import fields
from vllm_fleet.gateway.anthropic import openapi as anthropic_openapi
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}

_ERRORS = {
    "400": "Invalid request: bad JSON, wrong types, an unknown or refused field, a limit exceeded, or a prompt "
           "too long for the model",
    "401": "Missing or invalid API key",
    "404": "Unknown model",
    "413": "Request body too large",
    "429": "Rate limited; see Retry-After",
    "502": "The workers failed the request",
    "503": "No worker can take the request now; see Retry-After",
    "504": "The request did not finish before its deadline",
}


def _error_responses(*codes: str) -> dict:
    return {
        code: {"description": _ERRORS[code], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for code in codes
    }


def _generation(summary: str, schema: str, result: str, auth: bool) -> dict:
    return {"post": {
        "summary": summary,
        **({"security": [{"bearer": []}]} if auth else {}),
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": f"A {result} object, or server-sent events when stream is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_error_responses("400", *(("401",) if auth else ()), "404", "413", "429", "502", "503", "504"),
        },
    }}


def _get(summary: str, *, auth: bool, codes: tuple[str, ...] = (), content: str = "application/json",
         extra: dict | None = None) -> dict:
    operation = {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {content: {"schema": {"type": "string" if content != "application/json" else "object"}}}},
        **(extra or {}),
        **_error_responses(*codes, *(("401",) if auth else ())),
    }}
    if auth:
        operation["security"] = [{"bearer": []}]
    return {"get": operation}


def _operation(summary: str, *, auth: bool, codes: tuple[str, ...] = (), path_id: str | None = None,
               body: str | None = None, content: str = "application/json") -> dict:
    """One Batch API operation (gateway/batch/api.py)."""
    operation: dict = {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {content: {"schema": {"type": "object" if content ==
                                                                      "application/json" else "string"}}}},
        **_error_responses(*codes, *(("401",) if auth else ())),
    }}
    if path_id:
        operation["parameters"] = [{"name": path_id, "in": "path", "required": True, "schema": {"type": "string"}}]
    if body:
        operation["requestBody"] = {"required": True, "content": {body: {"schema": {"type": "object"}}}}
    if auth:
        operation["security"] = [{"bearer": []}]
    return operation


def _introspection_paths(auth: bool) -> dict:
    """vLLM's /version and /load (gateway/introspect.py). The token and render routes are left out
    on purpose: their bodies are vLLM's own models, answered only by a real vLLM worker (501 on a
    mock one), which the schemathesis run over this document would count as server errors."""
    return {
        "/version": _get("The workers' vLLM version", auth=auth),
        "/load": _get("Requests this gateway has open on its workers", auth=auth),
    }


def _batch_paths(auth: bool) -> dict:
    return {
        "/v1/files": {
            "post": _operation("Upload a JSONL file (multipart: purpose \"batch\", file)", auth=auth,
                               codes=("400", "413"), body="multipart/form-data"),
            "get": _operation("List your files", auth=auth),
        },
        "/v1/files/{file_id}": {
            "get": _operation("Retrieve a file", auth=auth, codes=("404",), path_id="file_id"),
            "delete": _operation("Delete a file", auth=auth, codes=("404",), path_id="file_id"),
        },
        "/v1/files/{file_id}/content": {
            "get": _operation("A file's content", auth=auth, codes=("404",), path_id="file_id",
                              content="application/jsonl"),
        },
        "/v1/batches": {
            "post": _operation("Create a batch (input_file_id, endpoint, completion_window \"24h\", metadata)",
                               auth=auth, codes=("400", "404"), body="application/json"),
            "get": _operation("List your batches (limit, after)", auth=auth, codes=("400",)),
        },
        "/v1/batches/{batch_id}": {"get": _operation("Retrieve a batch", auth=auth, codes=("404",),
                                                     path_id="batch_id")},
        "/v1/batches/{batch_id}/cancel": {"post": _operation("Cancel a batch", auth=auth, codes=("404",),
                                                             path_id="batch_id")},
    }


def _with_table(schema: dict, endpoint: str) -> dict:
    """The fields the schema does not model, from fields.py's table: the engine's (any JSON;
    vLLM's request model on the worker judges them), inert and refused ones; nothing else."""
    properties = schema.setdefault("properties", {})
    for name, rule in fields.TABLES[endpoint].items():
        if name not in properties:
            properties[name] = {"description": f"{rule.kind.value}: {rule.why}"}
    schema["additionalProperties"] = False
    return schema


def _responses_schema() -> dict:
    """/v1/responses: its field table (gateway/responses_fields.py); vLLM's ResponsesRequest judges the rest."""
    from vllm_fleet.gateway.responses_fields import RESPONSES

    properties = {name: {"description": f"{rule.kind.value}: {rule.why}"} for name, rule in RESPONSES.items()}
    properties["model"] = {"type": "string", "minLength": 1, "description": properties["model"]["description"]}
    return {"type": "object", "required": ["model", "input"], "properties": properties, "additionalProperties": False}


def openapi_document(config: GatewayConfig) -> dict:
    """The document for this gateway: routes need a key only when a keys file is configured."""
    auth = config.api_key_file is not None
    schemas = {"Error": _ERROR}
    for endpoint, model in (("chat", ChatCompletionRequest), ("completion", CompletionRequest)):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = _with_table(schema, endpoint)
    schemas["ResponsesRequest"] = _responses_schema()
    schemas.update(anthropic_openapi.schemas())
    not_ready = {"503": {"description": "Fewer serving workers than required",
                         "content": {"application/json": {"schema": {"type": "object"}}}}}
    forbidden = {"403": {"description": "The key is not an admin key",
                         "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "vllm-fleet gateway", "version": __version__,
                 "description": "OpenAI-compatible API in front of a fleet of vLLM workers. "
                                f"Bodies up to {config.max_body_bytes} bytes; n up to {config.max_n}."},
        "paths": {
            "/v1/chat/completions": _generation("Create a chat completion", "ChatCompletionRequest", "chat.completion", auth),
            "/v1/completions": _generation("Create a completion", "CompletionRequest", "text_completion", auth),
            "/v1/responses": _generation("Create a response (stateless)", "ResponsesRequest", "response", auth),
            "/v1/messages": anthropic_openapi.path(auth),
            "/v1/models": _get("List models", auth=auth),
            "/v1/models/{model}": {"get": {
                **_get("Retrieve a model", auth=auth, codes=("404",))["get"],
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            }},
            "/health": _get("The process is alive", auth=False),
            "/ready": _get("At least --ready-workers workers serve", auth=False, extra=not_ready),
            "/metrics": _get("Prometheus metrics", auth=auth, content="text/plain", extra=forbidden if auth else None),
            "/dashboard": _get("Status page (HTML)", auth=False, content="text/html"),
            "/dashboard/state.json": _get("Data of the status page", auth=auth, extra=forbidden if auth else None),
            **_batch_paths(auth),
            **_introspection_paths(auth),
        },
        "components": {
            "schemas": schemas,
            **({"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                               "description": "An API key from the gateway's keys file"}}}
               if auth else {}),
        },
    }
