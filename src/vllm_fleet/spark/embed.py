"""`embed(df, input_col=...)`: one embedding vector per row, from the fleet's pooling workers.

    out = embed(df, input_col="text", workers=["10.0.0.5:50051"])     # or registry="zk://..."

`out` has every input column plus `embedding` (array<float>), `error`, `attempts` and
`worker`: exactly one output row per input row, as `generate` does. (No per-row token count:
vLLM reports one usage for a request of many texts.)

Rows travel in micro-batches of `batch_size` texts, each one Pool request (vLLM's
EmbeddingRequest with a list input: the engine batches its texts, and the executor keeps up to
`max_in_flight` such requests out at once). Through the same per-process Router as generate
(executor.py): routing to pooling workers of the model, failover when a worker dies (a pooling
request is idempotent), admission. A batch vLLM refuses (one text too long, say) is split and
each row sent alone, so only the bad row carries the `error`; a null row is an error at once.
A failure whose type says a resend is safe (`FleetError.resend_safe`) is retried `row_attempts`
times, then becomes the rows' error.

The driver checks, before any task runs, that the column exists and is a string, and that the
model serves /v1/embeddings (ConfigError otherwise), as generate's driver does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry
from pydantic import Field, ValidationError
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from vllm_fleet.errors import ConfigError, FleetError, InvalidRequestError, NoWorkerError
from vllm_fleet.protocol.pooling import EMBEDDINGS, PoolRequest
from vllm_fleet.registry import open_registry
from vllm_fleet.router import Router
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.executor import process_loop, router_for

logger = logging.getLogger(__name__)

# Fields of vLLM's EmbeddingRequest that embed() itself sets; `params` carries the others.
_OWN_FIELDS = ("model", "input", "encoding_format", "request_id")


class SparkEmbedConfig(SparkGenerateConfig):
    """generate's settings (workers, router, retries, timeouts), plus what vLLM's embedding
    request takes besides its input (e.g. truncate_prompt_tokens, dimensions)."""

    embed_params: dict[str, Any] = Field(
        default_factory=dict, description="Other fields of vLLM's EmbeddingRequest, e.g. {'truncate_prompt_tokens': 128}")
    batch_size: int = Field(32, ge=1, description="Rows per Pool request (the engine batches them)")
    max_in_flight: int = Field(8, ge=1, description="Most Pool requests out at once per executor Python process")


@dataclass(slots=True)
class EmbedResult:
    vector: list[float] | None = None
    error: str | None = None
    attempts: int = 0
    worker: str | None = None


RESULT_FIELDS: list[tuple[str, pa.DataType]] = [
    ("error", pa.string()), ("attempts", pa.int32()), ("worker", pa.string()),
]


def embed(df: DataFrame, *, input_col: str, model: str | None = None, workers: list[str] | str | None = None,
          registry: str | None = None, params: dict[str, Any] | None = None, batch_size: int = 32,
          max_in_flight: int = 8, output_col: str = "embedding", router: dict[str, Any] | None = None,
          **options: Any) -> DataFrame:
    """Embed every row's `input_col` text on the fleet; see the module docstring.

    params: other fields of vLLM's EmbeddingRequest (truncate_prompt_tokens, dimensions, ...),
        judged by vLLM on the worker; embed() sets model, input and encoding_format itself.
    options: any other SparkGenerateConfig field (row_attempts, request_timeout_s, ...).
    """
    params = dict(params or {})
    own = sorted(set(params) & set(_OWN_FIELDS))
    if own:
        raise ConfigError(f"params may not set {', '.join(own)}: embed() sets them (input from input_col)")
    if isinstance(workers, str):
        workers = [w.strip() for w in workers.split(",") if w.strip()]
    values = dict(prompt_col=input_col, model=model, workers=workers, registry=registry, embed_params=params,
                  batch_size=batch_size, max_in_flight=max_in_flight, output_col=output_col, router=router, **options)
    try:
        config = SparkEmbedConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(f"vllm_fleet.spark.embed: {exc}") from None
    fields = {f.name: f for f in df.schema.fields}
    if input_col not in fields:
        raise ConfigError(f"input_col={input_col!r}: no such column; the DataFrame has {', '.join(fields)}")
    if not isinstance(fields[input_col].dataType, T.StringType):
        raise ConfigError(f"input_col={input_col!r} is {fields[input_col].dataType.simpleString()}, not string")
    added = [output_col, *(name for name, _ in RESULT_FIELDS)]
    clash = sorted(set(added) & set(fields))
    if clash:
        raise ConfigError(f"the DataFrame already has column(s) {', '.join(clash)} that embed() adds; rename them")
    config = config.model_copy(update={"model": _check_embedding_model(config)})
    schema = T.StructType([*df.schema.fields, T.StructField(output_col, T.ArrayType(T.FloatType())),
                           T.StructField("error", T.StringType()),
                           T.StructField("attempts", T.IntegerType()), T.StructField("worker", T.StringType())])
    return df.mapInArrow(functools.partial(embed_partition, config=config.model_dump()), schema)


def _check_embedding_model(config: SparkEmbedConfig) -> str | None:
    """From the driver: a serving worker is reachable and the model serves embeddings."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the caller may already run a loop
        return pool.submit(asyncio.run, _probe(config)).result()


async def _probe(config: SparkEmbedConfig) -> str | None:
    router = Router(open_registry(config.registry_spec), config.router_config(), metrics_registry=CollectorRegistry())
    try:
        await router.start()
        try:
            await router.wait_ready(config.connect_timeout_s)
        except NoWorkerError:
            raise ConfigError(f"no serving worker reachable at {config.registry_spec} within "
                              f"{config.connect_timeout_s:.0f}s") from None
        models = router.models()
        if config.model is None and len(models) > 1:
            raise ConfigError(f"the fleet serves several models ({', '.join(models)}); pass model=...")
        model = config.model or (models[0] if models else None)
        info = router.model_info(model) if model else None
        if info is None:
            raise ConfigError(f"model {model!r} is not served; served: {', '.join(models)}")
        if EMBEDDINGS not in info.pooling_endpoints:
            raise ConfigError(f"model {model!r} does not serve embeddings (its tasks: {', '.join(info.tasks) or 'generate'});"
                              " start workers with an embedding model, e.g. --model all-minilm-l6-v2")
        return model
    finally:
        await router.close()


def embed_partition(batches: Iterator[pa.RecordBatch], config: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function: every input row comes out once, with its vector or its error."""
    settings = SparkEmbedConfig(**config)
    embedder = _Embedder(router_for(settings), settings)
    loop = process_loop()
    for batch in batches:
        texts = batch.column(settings.prompt_col).to_pylist()
        results = loop.run(embedder.embed_rows(texts))
        vectors = pa.array([r.vector for r in results], pa.list_(pa.float32()))
        extra = [pa.array([getattr(r, name) for r in results], dtype) for name, dtype in RESULT_FIELDS]
        yield pa.RecordBatch.from_arrays([*batch.columns, vectors, *extra],
                                         names=[*batch.schema.names, settings.output_col,
                                                *(name for name, _ in RESULT_FIELDS)])


class _Embedder:
    """Rows → Pool requests of `batch_size` texts, at most `max_in_flight` out at once."""

    def __init__(self, router: Router, config: SparkEmbedConfig) -> None:
        self.router = router
        self.config = config
        self._slots: asyncio.Semaphore | None = None

    async def embed_rows(self, texts: list[Any]) -> list[EmbedResult]:
        if self._slots is None:  # made on the executor's loop
            self._slots = asyncio.Semaphore(self.config.max_in_flight)
        results: list[EmbedResult | None] = [None] * len(texts)
        sendable = []
        for i, text in enumerate(texts):
            if isinstance(text, str) and text:
                sendable.append(i)
            else:
                results[i] = EmbedResult(error="invalid input: the row's text is null or empty")
        size = self.config.batch_size
        groups = [sendable[k:k + size] for k in range(0, len(sendable), size)]
        answered = await asyncio.gather(*(self._group(group, [texts[i] for i in group]) for group in groups))
        for group, group_results in zip(groups, answered):
            for i, result in zip(group, group_results):
                results[i] = result
        return [r if r is not None else EmbedResult(error="internal error: no result") for r in results]

    async def _group(self, rows: list[int], texts: list[str]) -> list[EmbedResult]:
        assert self._slots is not None
        async with self._slots:
            results = await self._send(texts)
        if results is None:  # vLLM refused the batch: find the row(s) at fault, one by one
            results = [r for text in texts for r in (await self._send([text]) or [])]
        return results

    async def _send(self, texts: list[str]) -> list[EmbedResult] | None:
        """The rows' results; None when vLLM refused a batch of several (split and resend)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        body = {**self.config.embed_params, "input": texts, "encoding_format": "float"}
        if self.config.model:
            body["model"] = self.config.model
        body_json = json.dumps(body).encode()
        backoff, attempts, error = self.config.retry_backoff_s, 0, None
        for round_ in range(self.config.row_attempts):
            request = PoolRequest(request_id=f"spark-embed-{uuid.uuid4().hex}", endpoint=EMBEDDINGS,
                                  body_json=body_json)
            try:
                answer = await self.router.pool(request, model=self.config.model, deadline=deadline)
            except InvalidRequestError as exc:
                if len(texts) > 1:
                    return None
                return [EmbedResult(error=f"invalid request: {exc}", attempts=attempts + 1)]
            except FleetError as exc:
                error, attempts = exc, attempts + 1
                logger.warning("embedding request failed (%s); %d of %d", exc, round_ + 1, self.config.row_attempts,
                               extra={"request_id": request.request_id})
                if not exc.resend_safe:  # the type says (errors.py)
                    break
                if round_ + 1 < self.config.row_attempts and loop.time() + backoff < deadline:
                    await asyncio.sleep(backoff)
                    backoff *= 2
                continue
            data = json.loads(answer.result.body_json)["data"]
            tries = attempts + answer.attempts
            return [EmbedResult(vector=item["embedding"], attempts=tries, worker=answer.worker)
                    for item in sorted(data, key=lambda item: item["index"])]
        return [EmbedResult(error=f"{type(error).__name__}: {error}", attempts=max(1, attempts)) for _ in texts]
