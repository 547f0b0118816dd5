"""One input row ↔ one request input, and one result ↔ the columns it adds.

Request ids are derived from the row, never random: a Spark task that is retried sends the
same ids again, so a worker that still runs the first attempt's request refuses the copy
(DuplicateRequestError) instead of computing it twice; the answerer waits for the first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from vllm_fleet.protocol.types import ChatMessage, GenerateInput

# The columns generate() adds, in order (the output text column's name is configurable).
RESULT_FIELDS: list[tuple[str, pa.DataType]] = [
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("error", pa.string()),
    ("attempts", pa.int32()),
    ("worker", pa.string()),
]


@dataclass(slots=True)
class RowResult:
    output: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    attempts: int = 0
    worker: str | None = None

    @classmethod
    def failed(cls, error: str, *, attempts: int = 0, worker: str | None = None) -> RowResult:
        return cls(error=error, attempts=attempts, worker=worker)


def result_names(output_col: str) -> list[str]:
    return [output_col, *(name for name, _ in RESULT_FIELDS)]


def result_arrays(results: list[RowResult]) -> list[pa.Array]:
    """The added columns for `results`, output text first."""
    columns = [pa.array([r.output for r in results], pa.string())]
    for name, dtype in RESULT_FIELDS:
        columns.append(pa.array([getattr(r, name) for r in results], dtype))
    return columns


def to_messages(value: Any) -> list[ChatMessage]:
    """Chat messages from a cell: a list of {role, content} structs/maps (or a JSON string of one)."""
    if isinstance(value, str):
        value = json.loads(value)
    messages = []
    for item in value:
        if isinstance(item, list):  # a Spark map<string,string> arrives as a list of (key, value) pairs
            item = dict(item)
        messages.append(ChatMessage(role=str(item["role"]), content=str(item.get("content") or "")))
    return messages


def to_input(value: Any, *, chat: bool) -> GenerateInput:
    """The request input of one cell; ValueError says why the cell cannot be one."""
    if value is None:
        raise ValueError("the prompt is null" if not chat else "the messages are null")
    if not chat:
        return GenerateInput(text=str(value))
    try:
        return GenerateInput(messages=to_messages(value))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"messages must be a list of {{role, content}}: {exc}") from None


def content_of(item: GenerateInput) -> Any:
    if item.messages is not None:
        return [[m["role"], m.get("content")] for m in item.messages]
    return item.text


def request_id_for(item: GenerateInput | None, params: dict[str, Any], model: str | None, row_key: str) -> str:
    """`spk-<hash>` of what is asked (prompt or messages, params, model) and where the row sits."""
    payload = json.dumps([content_of(item) if item else None, params, model, row_key], sort_keys=True, default=str)
    return "spk-" + hashlib.blake2b(payload.encode(), digest_size=12).hexdigest()


def batch_request_id(row_ids: list[str]) -> str:
    """The id of one request carrying several rows: stable for the same rows in the same order."""
    return "spkb-" + hashlib.blake2b("|".join(row_ids).encode(), digest_size=12).hexdigest()
