"""What a Spark job needs to reach the fleet, as plain data: it travels to every executor.

Nothing here holds a channel or a thread. `SparkGenerateConfig.key()` names the per-process
client an executor builds from it (see `executor.py`), so tasks with the same settings share
one Router and its gRPC channels.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from vllm_fleet.config import FleetModel, validated
from vllm_fleet.errors import ConfigError
from vllm_fleet.protocol.sampling import Constraint, SamplingParams
from vllm_fleet.router import RouterConfig

SendAs = Literal["per_row", "one_request"]


class SparkGenerateConfig(FleetModel):
    """How `vllm_fleet.spark.generate` reads rows, batches them and reaches the workers."""

    workers: list[str] = Field(default_factory=list, description="Worker addresses host:port (or use registry)")
    registry: str | None = Field(None, description="Registry spec: zk://host:port/cluster, or host:port,host:port")
    model: str | None = Field(None, description="Model to ask for (default: the one model the fleet serves)")
    params: dict[str, Any] = Field(default_factory=dict, description="Sampling parameters (SamplingParams fields)")
    prompt_col: str | None = Field(None, description="Column with the prompt text")
    messages_col: str | None = Field(None, description="Column with chat messages: a list of {role, content}")
    session_col: str | None = Field(None, description="Column with the conversation key (rows of one session run in turn order)")
    turn_col: str | None = Field(None, description="Column with the turn number within a session")
    id_col: str | None = Field(None, description="Column with a stable row key for request ids (default: partition and position)")
    output_col: str = Field("output", description="Name of the column with the generated text")
    output_schema: str | None = Field(
        None, description="Typed answers: a Spark DDL schema, e.g. 'name STRING, age INT'; the model answers in JSON "
                          "under that schema and each field becomes a column (see docs/spark.md)"
    )
    batch_size: int = Field(32, ge=1, description="Rows per micro-batch: a batch is sent when it holds this many rows")
    batch_wait_ms: float = Field(
        20.0, ge=0, description="Longest a row waits for its micro-batch to fill before the batch is sent anyway"
    )
    max_in_flight: int = Field(64, ge=1, description="Most rows in flight at once per executor Python process")
    send_as: SendAs = Field(
        "per_row", description="per_row: one routed request per row; one_request: one request with the batch's inputs"
    )
    row_attempts: int = Field(
        3, ge=1, description="Times a row is sent through the router (each may itself fail over) before it becomes an error"
    )
    retry_backoff_s: float = Field(0.5, ge=0, description="Pause before a row is sent again (doubles each time)")
    request_timeout_s: float = Field(
        300.0, gt=0, description="Deadline of one row's request, retries included (a batch row's wait for a worker "
        "with slack does not count)")
    service_class: Literal["batch", "interactive"] = Field(
        "batch", description="batch: rows run in the capacity interactive traffic leaves idle and step aside for it "
        "(router/classes/service_class.py); interactive: rows compete with chat users as equals")
    stream_interval_ms: int = Field(
        250, ge=0, description="Workers send a row's tokens at most this often (its first token at once): the "
        "row's answer is written whole, so one chunk per engine step only spends the workers' and executors' CPU, "
        "which the chat streams on the same workers need; 0: every engine step")
    connect_timeout_s: float = Field(30.0, gt=0, description="How long an executor (and the driver check) waits for a serving worker")
    cache_ready_timeout_s: float = Field(
        60.0, ge=0, description="cache_aware: how long an executor's router waits, once, before its first row, for "
        "the model's tokenizer and the workers' KV events (loading the tokenizer imports transformers: ~6 s on a "
        "2-core host, more under load); rows sent before that route by load alone and pay shared prefixes again")
    progress_address: str | None = Field(
        None, description="host:port of a progress listener on the driver (spark-run sets it): each task sends its "
        "rows and tokens done there every half second (spark/progress.py)")
    router: dict[str, Any] = Field(default_factory=dict, description="RouterConfig fields (policy, max_attempts, ...)")
    ledger_path: str | None = Field(
        None, description="Answer ledger: a directory every executor can write (a shared mount); rows already "
                          "answered there are not generated again (needs id_col, or session_col and turn_col)"
    )

    @model_validator(mode="after")
    def _check(self) -> SparkGenerateConfig:
        if not self.workers and not self.registry:
            raise ValueError("no workers: pass workers=['host:port', ...] or registry='zk://host:port/cluster'")
        if self.workers and self.registry:
            raise ValueError("pass workers or registry, not both")
        if (self.prompt_col is None) == (self.messages_col is None):
            raise ValueError("pass exactly one of prompt_col and messages_col")
        if (self.session_col is None) != (self.turn_col is None):
            raise ValueError("sessions need both session_col and turn_col")
        if self.ledger_path is not None:
            if "://" in self.ledger_path:
                raise ValueError(f"ledger_path={self.ledger_path!r}: the ledger is a directory on a filesystem every "
                                 "executor mounts (e.g. /mnt/shared/ledger), not a URL")
            if self.id_col is None and not self.sessions:
                raise ValueError("ledger_path needs a stable row key to find a row again after a restart: pass "
                                 "id_col=<a column that names the row> (or session_col and turn_col)")
        return self

    @property
    def sessions(self) -> bool:
        return self.session_col is not None

    @property
    def registry_spec(self) -> str:
        return self.registry or ",".join(self.workers)

    def sampling_params(self) -> SamplingParams:
        params = dict(self.params)
        if isinstance(params.get("constraint"), dict):  # a Constraint, after a trip through plain data
            params["constraint"] = Constraint(**params["constraint"])
        return SamplingParams(**params)

    def router_config(self) -> RouterConfig:
        values = dict(self.router)
        if self.sessions:
            # A conversation must keep hitting the worker that holds its prefix cache, whichever
            # executor process sends the turn. No load bound: it counts this process's requests
            # only, so processes (and one process, turn to turn) chose differently. A session
            # runs one turn at a time, so it cannot pile load onto its worker; the hash spreads
            # sessions. It leaves its worker only when that worker stops serving.
            values.setdefault("policy", "session_affinity")
            values.setdefault("affinity_load_bound", None)
        return validated(RouterConfig, values)

    def key(self) -> str:
        """What identifies the executor-side client: only what shapes the Router."""
        return json.dumps({"registry": self.registry_spec, "router": self.router_config().model_dump(mode="json")},
                          sort_keys=True)


def build_config(**values: Any) -> SparkGenerateConfig:
    """The config from `generate`'s keyword arguments; `params` may be a dict or SamplingParams."""
    params = values.get("params")
    if isinstance(params, SamplingParams):
        # Only what differs from the default: 0, 0.0 and False can be values set on purpose (greedy,
        # a seed, skip_special_tokens=False), so they are compared by type as well as value.
        defaults = SamplingParams()
        params = {k: v for k, v in dataclasses.asdict(params).items()
                  if (type(v), v) != (type(getattr(defaults, k)), getattr(defaults, k))}
    elif params is None:
        params = {}
    elif not isinstance(params, dict):
        raise ConfigError(f"params must be a dict or SamplingParams, not {type(params).__name__}")
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"unknown sampling parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if (params.get("n") or 1) != 1:
        raise ConfigError("params n must be 1: generate() writes one output per row")
    if isinstance(params.get("constraint"), Constraint):
        params["constraint"] = dataclasses.asdict(params["constraint"])
    _check_body(params)
    values["params"] = params
    output_schema = values.get("output_schema")
    if output_schema is not None and not isinstance(output_schema, str):
        values["output_schema"] = _struct_json(output_schema)
    workers = values.get("workers")
    if isinstance(workers, str):
        values["workers"] = [w.strip() for w in workers.split(",") if w.strip()]
    try:
        return SparkGenerateConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(f"vllm_fleet.spark.generate: {problems}") from None


def _check_body(params: dict[str, Any]) -> None:
    """The typed parameters must make a request body (e.g. a constraint of one kind): a job that
    cannot build one fails before it reads a row. vLLM judges the values on the worker."""
    constraint = params.get("constraint")
    if constraint is not None and not isinstance(constraint, dict):
        raise ConfigError(f"params: constraint must be a Constraint or a dict of its fields, "
                          f"not {type(constraint).__name__}")
    try:
        typed = SamplingParams(**{**params, "constraint": Constraint(**constraint) if constraint else None})
        typed.body_fields("completion")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params: {exc}") from None


def _struct_json(value: Any) -> str:
    """A StructType as Spark's JSON form: it travels as text and reads back without a session."""
    from pyspark.sql.types import StructType

    if not isinstance(value, StructType):
        raise ConfigError(f"output_schema must be a DDL string or a StructType, not {type(value).__name__}")
    return value.json()


def _describe(err: dict[str, Any]) -> str:
    message = str(err["msg"]).removeprefix("Value error, ")
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {message}" if where else message
