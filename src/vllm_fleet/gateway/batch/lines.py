"""A batch input file's lines, checked one by one, and the output and error lines in OpenAI's shape.

    input   {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
    output  {"id": "batch_req_…", "custom_id": "a", "response": {"status_code": 200, "request_id": "…",
             "body": <the endpoint's answer>}, "error": null}
    error   the same with the failed status and its error body, or, for a line that is not a
            request at all (bad JSON, no custom_id, a repeated one, another url or method),
            "response": null and "error": {"code", "message"}

A malformed line fails alone; the others run. Whether a body is acceptable is the endpoint's own
rule (translate.py), applied when the line runs, so a batch line is refused exactly as the same
request online.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

from vllm_fleet.gateway.batch.store import LineRow

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


def line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


class FileProblem(Exception):
    """The input file as a whole cannot make a batch: the batch fails with this in its `errors`.
    Not recoverable by retrying; the user fixes the file."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def errors(self) -> dict:
        return {"object": "list", "data": [{"code": self.code, "message": self.message, "param": None, "line": None}]}


def check_lines(data: bytes, endpoint: str, max_lines: int) -> list[LineRow]:
    """Every non-blank line as a LineRow: pending if it is a request for `endpoint`, else failed
    with its error line."""
    rows: list[LineRow] = []
    seen: set[str] = set()
    for idx, (start, raw) in enumerate(_lines(data)):
        if idx >= max_lines:
            raise FileProblem("too_many_requests", f"the file has more than {max_lines} requests, this gateway's "
                              "limit (--batch-max-lines); split it into several batches")
        custom_id, problem = _check(raw, endpoint, seen, idx + 1)
        if problem is None:
            seen.add(custom_id)
            rows.append(LineRow(idx, custom_id, start, len(raw)))
        else:
            rows.append(LineRow(idx, custom_id, start, len(raw), "failed", error_line(custom_id, *problem)))
    if not rows:
        raise FileProblem("empty_file", "the input file has no requests")
    return rows


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    start = 0
    for raw in data.split(b"\n"):
        if raw.strip():
            yield start, raw
        start += len(raw) + 1


def _check(raw: bytes, endpoint: str, seen: set[str], number: int) -> tuple[str | None, tuple[str, str] | None]:
    """(custom_id, None) for a good line, else (custom_id if any, (code, message))."""
    try:
        line = json.loads(raw)
    except ValueError as exc:
        return None, ("invalid_json_line", f"line {number} is not valid JSON: {exc}")
    if not isinstance(line, dict):
        return None, ("invalid_json_line", f"line {number} is not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, ("missing_custom_id", f"line {number} has no custom_id (a non-empty string)")
    if custom_id in seen:
        return custom_id, ("duplicate_custom_id", f"line {number} repeats custom_id {custom_id!r}; each must be unique")
    if line.get("method") != "POST":
        return custom_id, ("invalid_method", f"line {number}: method must be \"POST\", not {line.get('method')!r}")
    if line.get("url") != endpoint:
        return custom_id, ("invalid_url", f"line {number}: url {line.get('url')!r} is not the batch's endpoint {endpoint}")
    if not isinstance(line.get("body"), dict):
        return custom_id, ("invalid_body", f"line {number}: body must be a JSON object")
    extra = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if extra:
        return custom_id, ("invalid_line", f"line {number}: unknown field {extra[0]!r}")
    return custom_id, None


def output_line(custom_id: str, request_id: str, status: int, body: dict) -> str:
    return json.dumps({"id": line_id(), "custom_id": custom_id,
                       "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None},
                      ensure_ascii=False)


def error_line(custom_id: str | None, code: str, message: str) -> str:
    return json.dumps({"id": line_id(), "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": message}}, ensure_ascii=False)
