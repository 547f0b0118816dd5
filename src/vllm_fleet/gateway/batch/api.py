"""The Batch API's routes, as OpenAI's clients call them; each key sees only its own files and batches.

    POST   /v1/files                    multipart: purpose ("batch") and file (JSONL); 413 past --batch-max-file-bytes
    GET    /v1/files                    ?purpose=&limit=
    GET    /v1/files/{id}
    GET    /v1/files/{id}/content
    DELETE /v1/files/{id}
    POST   /v1/batches                  input_file_id, endpoint, completion_window ("24h"), metadata
    GET    /v1/batches                  ?limit=&after=
    GET    /v1/batches/{id}
    POST   /v1/batches/{id}/cancel

Another key's file or batch is a 404, as one that does not exist. With keys off every caller is
the same owner (""). The store opens on first use, or at start when it already exists (to resume
the batches it holds), so a gateway that never serves a batch writes nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry

from vllm_fleet.config import env_cache_dir
from vllm_fleet.gateway.api_error import ApiError, bad_request
from vllm_fleet.gateway.asgi import Response
from vllm_fleet.gateway.batch.lines import ENDPOINTS
from vllm_fleet.gateway.batch.multipart import parse_form
from vllm_fleet.gateway.batch.progress import BatchMetrics
from vllm_fleet.gateway.batch.runner import Admit, BatchRunner
from vllm_fleet.gateway.batch.store import FileRow, Store
from vllm_fleet.gateway.call import Call, Route
from vllm_fleet.gateway.completions import CompletionHandler
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.json_body import json_object

FILE_PREFIX = "/v1/files/"
BATCH_PREFIX = "/v1/batches/"
WINDOW_S = 24 * 3600
_BATCH_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata"}


class BatchApi:
    def __init__(self, completions: CompletionHandler, config: GatewayConfig, registry: CollectorRegistry) -> None:
        self.completions = completions
        self.config = config
        self.directory = Path(config.batch_dir) if config.batch_dir else env_cache_dir() / "batch"
        self.metrics = BatchMetrics(registry)
        self.admit: Admit | None = None  # awaited before each line starts (tests; the wait for slack is the router's)
        self._store: Store | None = None
        self.runner: BatchRunner | None = None
        self._started = False

    def routes(self) -> dict[tuple[str, str], Route]:
        """The routes without a path parameter, for app.py's table."""
        return {("POST", "/v1/files"): Route("key", self.upload), ("GET", "/v1/files"): Route("key", self.list_files),
                ("POST", "/v1/batches"): Route("key", self.create), ("GET", "/v1/batches"): Route("key", self.list_batches)}

    def route(self, method: str, path: str) -> Route | None:
        """The route for a path with an id in it; None when the path is not ours; 405 for another method."""
        if path.startswith(FILE_PREFIX):
            rest = path[len(FILE_PREFIX):]
            table = {"GET": self.content} if rest.endswith("/content") else {"GET": self.file, "DELETE": self.delete}
        elif path.startswith(BATCH_PREFIX):
            rest = path[len(BATCH_PREFIX):]
            table = {"POST": self.cancel} if rest.endswith("/cancel") else {"GET": self.batch}
        else:
            return None
        handler = table.get(method)
        if handler is None:
            error = ApiError(405, f"{method} is not allowed on {path}", code="method_not_allowed")
            error.extra_headers = [(b"allow", ", ".join(sorted(table)).encode())]
            raise error
        return Route("key", handler)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume the batches of an existing store; a new one is made on first use."""
        self._started = True
        if (self.directory / "batch.sqlite3").exists():
            await self._open()

    async def stop(self) -> None:
        self._started = False
        if self.runner is not None:
            await self.runner.stop()
            self.runner = None
        if self._store is not None:
            self._store.close()
            self._store = None

    async def _open(self) -> Store:
        if self._store is None:
            self._store = await asyncio.to_thread(Store, self.directory)
        if self.runner is None and self._started:
            self.runner = BatchRunner(self._store, self.completions, self.config, self.metrics, admit=self._admit)
            self.runner.start()
        return self._store

    async def _admit(self, batch_id: str) -> None:
        if self.admit is not None:  # read at each line, so it may be set or changed at any time
            await self.admit(batch_id)

    # -- files ------------------------------------------------------------------------------

    async def upload(self, call: Call) -> Response:
        body = await call.http.read_body(self.config.batch_max_file_bytes)
        form = await asyncio.to_thread(parse_form, call.http.headers.get("content-type", ""), body)
        purpose = form.get("purpose")
        if purpose is None:
            raise bad_request("purpose is required (\"batch\")", param="purpose", code="missing_required_parameter")
        if purpose.data != b"batch":
            raise bad_request(f"purpose {purpose.data.decode(errors='replace')!r} is not served here; only \"batch\"",
                              param="purpose", code="invalid_value")
        upload = form.get("file")
        if upload is None or upload.filename is None:
            raise bad_request("file is required: the JSONL file as a multipart file part", param="file",
                              code="missing_required_parameter")
        store = await self._open()
        row = FileRow("file-" + secrets.token_hex(12), _owner(call), "batch", upload.filename or "upload.jsonl",
                      len(upload.data), int(time.time()))
        await asyncio.to_thread(_write_file, store.path_of(row.id), upload.data)
        await asyncio.to_thread(store.add_file, row)
        return Response.json(row.object())

    async def list_files(self, call: Call) -> Response:
        query = _query(call)
        store = await self._open()
        rows = await asyncio.to_thread(store.files, _owner(call), query.get("purpose"), _limit(query, 10_000))
        return Response.json({"object": "list", "data": [r.object() for r in rows], "has_more": False})

    async def file(self, call: Call) -> Response:
        return Response.json((await self._file(call, call.http.path[len(FILE_PREFIX):])).object())

    async def content(self, call: Call) -> Response:
        row = await self._file(call, call.http.path[len(FILE_PREFIX):].removesuffix("/content"))
        data = await asyncio.to_thread(self._store.path_of(row.id).read_bytes)
        return Response(200, data, b"application/jsonl")

    async def delete(self, call: Call) -> Response:
        file_id = call.http.path[len(FILE_PREFIX):]
        store = await self._open()
        if not await asyncio.to_thread(store.delete_file, file_id, _owner(call)):
            raise _no_file(file_id)
        return Response.json({"id": file_id, "object": "file", "deleted": True})

    async def _file(self, call: Call, file_id: str) -> FileRow:
        store = await self._open()
        row = await asyncio.to_thread(store.file, file_id, _owner(call))
        if row is None:
            raise _no_file(file_id)
        return row

    # -- batches ----------------------------------------------------------------------------

    async def create(self, call: Call) -> Response:
        body = json_object(await call.http.read_body(self.config.max_body_bytes))
        unknown = sorted(set(body) - _BATCH_FIELDS)
        if unknown:
            raise bad_request(f"unknown field '{unknown[0]}'", param=unknown[0], code="unknown_field")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise bad_request(f"endpoint {endpoint!r} is not served by batches here; use one of "
                              f"{', '.join(ENDPOINTS)}", param="endpoint", code="invalid_value")
        if body.get("completion_window") != "24h":
            raise bad_request(f"completion_window {body.get('completion_window')!r}: only \"24h\" is supported",
                              param="completion_window", code="invalid_value")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and
                                         all(isinstance(v, str) for v in metadata.values())):
            raise bad_request("metadata: at most 16 string values", param="metadata", code="invalid_value")
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise bad_request("input_file_id is required", param="input_file_id", code="missing_required_parameter")
        store = await self._open()
        row = await asyncio.to_thread(store.file, input_file_id, _owner(call))
        if row is None:
            raise _no_file(input_file_id, param="input_file_id")
        if row.purpose != "batch":
            raise bad_request(f"file {input_file_id} has purpose {row.purpose!r}; a batch needs a \"batch\" file",
                              param="input_file_id", code="invalid_value")
        batch_id = "batch_" + secrets.token_hex(12)
        created = int(time.time())
        data = {"endpoint": endpoint, "input_file_id": input_file_id, "completion_window": "24h",
                "metadata": metadata, "expires_at": created + WINDOW_S}
        await asyncio.to_thread(store.add_batch, batch_id, _owner(call), created, data)
        if self.runner is not None:
            self.runner.wake()
        return Response.json(await asyncio.to_thread(store.batch, batch_id))

    async def list_batches(self, call: Call) -> Response:
        query = _query(call)
        limit = _limit(query, 100, default=20)
        store = await self._open()
        batches = await asyncio.to_thread(store.batches, _owner(call), limit + 1, query.get("after"))
        page = batches[:limit]
        return Response.json({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(batches) > limit})

    async def batch(self, call: Call) -> Response:
        return Response.json(await self._batch(call, call.http.path[len(BATCH_PREFIX):]))

    async def cancel(self, call: Call) -> Response:
        batch_id = call.http.path[len(BATCH_PREFIX):].removesuffix("/cancel")
        batch = await self._batch(call, batch_id)
        if not await asyncio.to_thread(self._store.set_status, batch_id, "cancelling",
                                       only_from=("validating", "in_progress")):
            if batch["status"] in ("cancelling", "cancelled"):
                return Response.json(batch)
            raise ApiError(409, f"batch {batch_id} is {batch['status']}; only a validating or in_progress batch "
                           "can be cancelled", code="invalid_state")
        if self.runner is not None:
            self.runner.wake(cancel=batch_id)
        return Response.json(await asyncio.to_thread(self._store.batch, batch_id))

    async def _batch(self, call: Call, batch_id: str) -> dict:
        store = await self._open()
        batch = await asyncio.to_thread(store.batch, batch_id, _owner(call))
        if batch is None:
            raise ApiError(404, f"no batch {batch_id!r}", param="batch_id", code="not_found")
        return batch


def _owner(call: Call) -> str:
    return call.key_id or ""


def _no_file(file_id: str, param: str = "file_id") -> ApiError:
    return ApiError(404, f"no file {file_id!r}", param=param, code="not_found")


def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # a reader never sees half a file


def _query(call: Call) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(call.http.query).items()}


def _limit(query: dict[str, str], most: int, default: int | None = None) -> int:
    raw = query.get("limit")
    if raw is None:
        return default or most
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise bad_request(f"limit must be a whole number from 1 to {most}", param="limit", code="invalid_value")
    return int(raw)

