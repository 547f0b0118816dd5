"""The driver side: check the job before any task runs, then plan the mapInArrow.

Everything that would make every row fail — a missing column, a column of the wrong type,
no reachable worker, a model nobody serves — is a ConfigError here, raised by `generate()`
itself, so a misconfigured job never starts. What can go wrong for one row (a worker dying,
a timeout, a prompt that is too long) is that row's `error` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import os
import tempfile
from typing import Any

from prometheus_client import CollectorRegistry
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from vllm_fleet.errors import ConfigError, NoWorkerError
from vllm_fleet.protocol.sampling import Constraint
from vllm_fleet.registry import open_registry
from vllm_fleet.router import Router
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.executor import answer_partition
from vllm_fleet.spark.output_schema import column_types, json_schema, parse_output_schema

METADATA_KEY = "vllm_fleet"


def result_schema(config: SparkGenerateConfig) -> list[T.StructField]:
    """The columns generate() adds, then the output_schema fields (nullable: a row that failed
    has none). The output column carries the job's column names in its metadata, so
    collect_sessions() can find the session and turn columns on its own."""
    metadata = {METADATA_KEY: json.dumps({"session_col": config.session_col, "turn_col": config.turn_col,
                                          "prompt_col": config.prompt_col, "messages_col": config.messages_col})}
    return [
        T.StructField(config.output_col, T.StringType(), True, metadata=metadata),
        T.StructField("finish_reason", T.StringType(), True),
        T.StructField("prompt_tokens", T.LongType(), True),
        T.StructField("completion_tokens", T.LongType(), True),
        T.StructField("error", T.StringType(), True),
        T.StructField("attempts", T.IntegerType(), True),
        T.StructField("worker", T.StringType(), True),
        *(T.StructField(f.name, f.dataType, True, f.metadata) for f in output_fields(config)),
    ]


def output_fields(config: SparkGenerateConfig) -> list[T.StructField]:
    """The typed answer fields (empty without output_schema); `plan` stored them as Spark's JSON."""
    if config.output_schema is None:
        return []
    return list(parse_output_schema(config.output_schema).fields)


def with_output_schema(config: SparkGenerateConfig) -> SparkGenerateConfig:
    """Parse output_schema (DDL needs the driver's session) and ask for answers under its JSON
    schema: `params.constraint`, which the worker hands to vLLM's structured outputs."""
    if config.output_schema is None:
        return config
    if config.params.get("constraint") is not None:
        raise ConfigError("pass output_schema or a params constraint, not both: output_schema sets the constraint")
    struct = parse_output_schema(config.output_schema)
    constraint = dataclasses.asdict(Constraint(json_schema=json.dumps(json_schema(struct))))
    return config.model_copy(update={"output_schema": column_types(struct).json(),
                                     "params": {**config.params, "constraint": constraint}})


def with_ledger(config: SparkGenerateConfig) -> SparkGenerateConfig:
    """The ledger directory as an absolute path (executors run in other working directories),
    created and checked writable here so that a wrong path fails the job before it reads a row."""
    if config.ledger_path is None:
        return config
    path = os.path.abspath(config.ledger_path)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"ledger_path={config.ledger_path!r} is not a directory this job can write: {exc}; "
                          "pass a directory on a filesystem every executor mounts") from None
    return config.model_copy(update={"ledger_path": path})


def plan(df: DataFrame, config: SparkGenerateConfig, *, check_workers: bool = True) -> DataFrame:
    """Validate, resolve the model, and return the answered DataFrame (lazy, like any other)."""
    config = with_output_schema(config)
    check_columns(df.schema, config)
    config = with_ledger(config)
    if check_workers:
        config = config.model_copy(update={"model": check_fleet(config)})
    schema = T.StructType([*df.schema.fields, *result_schema(config)])
    if config.sessions:
        # A conversation must sit in one partition; the executor orders its turns.
        df = df.repartition(F.col(config.session_col))
    function = functools.partial(answer_partition, config=config.model_dump())
    return df.mapInArrow(function, schema)


def check_columns(schema: T.StructType, config: SparkGenerateConfig) -> None:
    fields = {f.name: f for f in schema.fields}
    wanted = {"prompt_col": config.prompt_col, "messages_col": config.messages_col,
              "session_col": config.session_col, "turn_col": config.turn_col, "id_col": config.id_col}
    for option, name in wanted.items():
        if name is not None and name not in fields:
            raise ConfigError(f"{option}={name!r}: no such column; the DataFrame has {', '.join(fields) or 'no columns'}")
    if config.prompt_col and not isinstance(fields[config.prompt_col].dataType, T.StringType):
        raise ConfigError(f"prompt_col={config.prompt_col!r} is {fields[config.prompt_col].dataType.simpleString()}, "
                          f"not string; cast it (F.col({config.prompt_col!r}).cast('string'))")
    if config.messages_col and not _is_messages(fields[config.messages_col].dataType):
        raise ConfigError(f"messages_col={config.messages_col!r} is {fields[config.messages_col].dataType.simpleString()}; "
                          "expected array<struct<role:string,content:string>>, array<map<string,string>> or a JSON string")
    typed = [f.name for f in output_fields(config)]
    added = [f.name for f in result_schema(config)]
    clash = sorted(set(typed) & set(added[:len(added) - len(typed)]))
    if clash:
        raise ConfigError(f"output_schema field(s) {', '.join(clash)} would clash with the column(s) generate() "
                          "adds; rename the field(s) (or pass output_col=... for the text column)")
    clash = sorted(set(added) & set(fields))
    if clash:
        raise ConfigError(f"the DataFrame already has column(s) {', '.join(clash)} that generate() adds; "
                          "rename them (or pass output_col=..., or rename the output_schema fields)")


def _is_messages(dtype: T.DataType) -> bool:
    if isinstance(dtype, T.StringType):
        return True
    if not isinstance(dtype, T.ArrayType):
        return False
    element = dtype.elementType
    if isinstance(element, T.StructType):
        return {"role", "content"} <= set(element.names)
    return isinstance(element, T.MapType)


def check_fleet(config: SparkGenerateConfig) -> str | None:
    """Reach the fleet from the driver: some worker must serve, and serve the model. Returns the
    model to ask for (the fleet's only one when none is named)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the caller may already run a loop
        return pool.submit(asyncio.run, _probe(config)).result()


async def _probe(config: SparkGenerateConfig) -> str | None:
    where = f"registry {config.registry}" if config.registry else f"workers {', '.join(config.workers)}"
    router = Router(open_registry(config.registry_spec), config.router_config(), metrics_registry=CollectorRegistry())
    try:
        await router.start()
        try:
            await router.wait_ready(config.connect_timeout_s)
        except NoWorkerError:
            raise ConfigError(f"no serving worker reachable at {where} within {config.connect_timeout_s:.0f}s; "
                              "start workers or fix workers=/registry=") from None
        models = router.models()
        if config.model is not None and config.model not in models:
            raise ConfigError(f"model {config.model!r} is not served by {where}; served: {', '.join(models)}")
        if config.model is None and len(models) > 1:
            raise ConfigError(f"{where} serve several models ({', '.join(models)}); pass model=...")
        return config.model or (models[0] if models else None)
    finally:
        await router.close()


def collect_sessions(df: DataFrame, *, session_col: str | None = None, turn_col: str | None = None,
                     output_col: str = "output") -> DataFrame:
    """One row per session: `turns` = the session's rows (all columns) ordered by turn. Session
    and turn columns default to those generate() was given."""
    saved: dict[str, Any] = {}
    if output_col in df.columns:
        saved = json.loads(df.schema[output_col].metadata.get(METADATA_KEY, "{}"))
    session_col = session_col or saved.get("session_col")
    turn_col = turn_col or saved.get("turn_col")
    if not session_col or not turn_col:
        raise ConfigError("collect_sessions: pass session_col= and turn_col= (the DataFrame does not come from "
                          "generate(session_col=..., turn_col=...))")
    others = [c for c in df.columns if c not in (session_col, turn_col)]
    turn = F.struct(F.col(turn_col).alias(turn_col), *[F.col(c) for c in others])
    return (df.groupBy(session_col)
              .agg(F.sort_array(F.collect_list(turn)).alias("turns"))
              .withColumn("num_turns", F.size("turns")))
